"""Hosted providers through litellm: the only module that imports it, lazily, at first use.

litellm costs seconds to import and milliseconds of CPU per call, so it is loaded only when
a litellm deployment exists, and nothing on the vLLM path touches it. It runs offline and
quiet: its bundled price map and tokenizers only, no telemetry, no retries of its own (a
failed call is one recorded attempt; the next target is the gateway's choice), and its cost
figures are never read: kvgate prices usage with its own dated price book.

    ProviderFailure (UpstreamError)   status as the provider answered; ``retryable`` for
                                      connect errors, timeouts, 429 and 5xx

Anthropic's Messages wire, for targets that do not speak it, is translated here too, with
litellm's own adapter (``litellm.llms.anthropic.messages.adapters``): the request into
chat, the chat answer (or its stream's chunks) back into Messages. The chat call itself is
the gateway's, as any chat to that target (gateway/serving/translated.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import orjson

from gateway.config import ProviderTarget, anthropic_family, prepare_litellm_environment
from gateway.errors import InvalidRequest, UpstreamError
from gateway.usage import Usage, UsageSource, from_litellm

log = logging.getLogger("kvgate.providers")


# The OpenAI chat parameters a client may send on to a provider. litellm takes its own
# options as keyword arguments beside them (api_base, api_key, mock_response,
# custom_llm_provider, credentials of clouds…): passed from a body, a client could send the
# operator's key to a host of its choosing or get an answer no provider gave. Only these
# leave the gateway; anything else in the body is dropped, as litellm's drop_params would.
CHAT_PARAMETERS = frozenset(
    {
        "messages",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
CHARS_PER_TOKEN = 4  # only for estimates when a provider reported no usage
GENERATED = ("content", "tool_calls", "reasoning_content", "function_call")
# Sent when a target names no key: litellm would otherwise take one from the provider's usual
# environment variable, and only Settings reads the environment (keys are named explicitly).
NO_KEY = "kvgate-no-key-configured"


def now() -> datetime:
    """The time now, in UTC."""
    return datetime.now(UTC)


class ProviderFailure(UpstreamError):
    """A provider call that failed; ``retryable`` when another target may well succeed."""

    def __init__(self, message: str, *, status: int | None, retryable: bool) -> None:
        super().__init__(message)
        self.provider_status = status
        self.retryable = retryable
        if status is not None and 400 <= status < 500:
            # The client's request (or its quota) is at fault: say so with the same status.
            self.status = status
            self.type = "rate_limit_error" if status == 429 else "invalid_request_error"


def failure(exc: Exception, model: str) -> ProviderFailure:
    """Map any litellm exception: they all carry the provider's HTTP status, if there was one."""
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    name = type(exc).__name__
    connect = name in {"APIConnectionError", "Timeout", "ServiceUnavailableError"}
    retryable = connect or status is None or status == 429 or status >= 500
    message = " ".join(str(getattr(exc, "message", None) or exc).split())
    return ProviderFailure(
        f"{model}: {name} ({status or 'no status'}): {message[:300]}",
        status=status,
        retryable=retryable,
    )


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """One call to one target: the client's chat body and the key for that target."""

    target: ProviderTarget
    body: Mapping[str, Any]
    api_key: str | None = None
    stream: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete response, in OpenAI's wire shape, with its usage normalised."""

    body: dict[str, Any]
    usage: Usage
    service_tier: str | None
    finish_reason: str | None
    raw_usage: dict[str, Any] | None = None  # litellm's usage, in OpenAI's shape


def service_tier(data: Mapping[str, Any]) -> str | None:
    """The tier the provider says it served (OpenAI: top level; Anthropic: inside usage)."""
    usage = data.get("usage")
    tier = data.get("service_tier") or (
        usage.get("service_tier") if isinstance(usage, dict) else None
    )
    return str(tier) if tier else None


def cache_marks(ttl: str) -> dict[str, str]:
    """The ``cache_control`` for a TTL: ephemeral, with ``ttl`` unless it is the default 5m."""
    return {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}


def mark_stable_prefix(body: dict[str, Any], ttl: str) -> None:
    """Mark the end of the tools and of the last system message with ``cache_control``.

    Anthropic caches everything up to a marked block; tools come first and the system
    prompt next, so these two marks cover the part that repeats across requests.
    """
    marks = cache_marks(ttl)
    tools = body.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[-1], dict):
        body["tools"] = [*tools[:-1], {**tools[-1], "cache_control": marks}]
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") != "system":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts: list[Any] = [{"type": "text", "text": content}]
        elif isinstance(content, list) and content and isinstance(content[-1], dict):
            parts = list(content)
        else:
            return
        parts[-1] = {**parts[-1], "cache_control": marks}
        body["messages"] = [
            *messages[:index],
            {**message, "content": parts},
            *messages[index + 1 :],
        ]
        return


def prompt_estimate(body: Mapping[str, Any]) -> int:
    """Prompt tokens guessed from the messages' text, for streams that report no usage."""
    chars = 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(
                len(p.get("text", ""))
                for p in content
                if isinstance(p, dict) and isinstance(p.get("text", ""), str)
            )
    return chars // CHARS_PER_TOKEN


def _dump(value: Any) -> dict[str, Any]:
    dumped = value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else dict(value)
    return dumped if isinstance(dumped, dict) else {}


@dataclass(slots=True)
class ProviderStream:
    """A litellm stream as OpenAI SSE events; its usage is known once it has ended.

    The first chunk is read before the stream is handed to the client, so a provider that
    fails at once fails over like a non-streaming call, before any byte went out.
    """

    source: Any  # litellm's CustomStreamWrapper
    request: ProviderRequest
    first: Any = None
    first_at: datetime | None = None
    usage_chunk: dict[str, Any] | None = None
    finish_reason: str | None = None
    _tier_in_events: str | None = None
    content_chunks: int = 0
    ended: bool = False
    _estimate: int = field(default=0)

    async def start(self) -> None:
        """Wait for the first chunk, so that a provider's failure raises before any response."""
        self._estimate = prompt_estimate(self.request.body)
        try:
            self.first = await self.source.__anext__()
        except StopAsyncIteration:
            self.ended = True
        except Exception as exc:  # litellm raises provider errors of many types here
            await self.close()
            raise failure(exc, self.request.target.litellm_model) from exc
        self.first_at = now()

    async def events(self) -> AsyncIterator[bytes]:
        """Each content chunk as one ``data:`` event; the usage-only chunk is kept back."""
        if self.first is not None:
            first, self.first = self.first, None
            event = self._event(first)
            if event is not None:
                yield event
        while not self.ended:
            try:
                chunk = await self.source.__anext__()
            except StopAsyncIteration:
                self.ended = True
                return
            except Exception as exc:  # a stream that breaks half way, in litellm's types
                raise failure(exc, self.request.target.litellm_model) from exc
            event = self._event(chunk)
            if event is not None:
                yield event

    def _event(self, chunk: Any) -> bytes | None:
        data = _dump(chunk)
        self._tier_in_events = service_tier(data) or self._tier_in_events
        if isinstance(data.get("usage"), dict) and not data.get("choices"):
            self.usage_chunk = data
            return None
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            delta = choice.get("delta")
            # About one token a chunk: the estimate of a stream that never reports usage.
            if isinstance(delta, dict) and any(delta.get(k) for k in GENERATED):
                self.content_chunks += 1
        data.pop("usage", None)
        return b"data: " + orjson.dumps(data) + b"\n\n"

    @property
    def service_tier(self) -> str | None:
        """The tier the provider says it served: in the events (OpenAI), or in the usage that
        litellm keeps from the stream's start (Anthropic reports it in message_start, and
        litellm drops it from the chunks it hands on)."""
        if self._tier_in_events is not None:
            return self._tier_in_events
        for chunk in reversed(getattr(self.source, "chunks", ())):
            usage = getattr(chunk, "usage", None)
            tier = getattr(usage, "service_tier", None) if usage is not None else None
            if isinstance(tier, str) and tier:
                return tier
        return None

    def _reported(self) -> dict[str, Any] | None:
        """The latest usage the provider itself sent, as litellm kept it.

        litellm fills in a usage chunk of its own (counted with its tokenizer) when the
        provider sent none; only chunks that carried the provider's usage count as reported.
        """
        latest = None
        for chunk in getattr(self.source, "chunks", ()):
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                latest = usage
        return _dump(latest) if latest is not None else None

    def usage(self) -> Usage:
        """The final usage: as reported, or estimated (and marked so) when none came."""
        reported = self._reported()
        if self.ended and reported is not None and self.usage_chunk is not None:
            return from_litellm(self.usage_chunk.get("usage"))
        return self.usage_so_far()

    def usage_so_far(self) -> Usage:
        """Tokens of a stream that did not finish: its reported prompt, output counted."""
        reported = self._reported()
        if reported is None:
            return Usage(
                uncached_tokens=self._estimate,
                output_tokens=self.content_chunks,
                source=UsageSource.ESTIMATED,
            )
        usage = from_litellm(reported)
        return Usage(
            usage.uncached_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            max(usage.output_tokens, self.content_chunks),
            UsageSource.ESTIMATED,
            usage.cache_write_1h_tokens,
        )

    async def close(self) -> None:
        """Stop reading; closing litellm's stream closes the provider connection."""
        self.ended = True
        closer = getattr(self.source, "aclose", None)
        if closer is not None:
            try:
                await closer()
            except Exception:  # closing a broken stream must not hide why it broke
                log.debug("closing a provider stream failed", exc_info=True)


PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"


def bundled_price_map() -> tuple[str, dict[str, Any]]:
    """litellm's version and the price map inside its package, read without importing it."""
    from importlib.metadata import version
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        raise ProviderFailure(
            "litellm is not installed: pip install 'kvgate[providers]'",
            status=None,
            retryable=False,
        )
    path = Path(next(iter(spec.submodule_search_locations))) / PRICE_MAP_FILE
    data = orjson.loads(path.read_bytes())
    return version("litellm"), data if isinstance(data, dict) else {}


def _no_cost(*_args: Any, **_kwargs: Any) -> None:
    """Stands in for litellm's cost calculator: its price map is not consulted per request."""
    return None


class Providers:
    """Calls hosted models through litellm; litellm is imported on the first ``load``."""

    def __init__(self) -> None:
        self._litellm: ModuleType | None = None

    def load(self) -> ModuleType:
        """Import litellm offline and quiet (seconds: call it at startup, off the loop)."""
        if self._litellm is None:
            prepare_litellm_environment()
            import litellm
            from litellm.litellm_core_utils.litellm_logging import Logging

            litellm.telemetry = False
            litellm.suppress_debug_info = True
            litellm.drop_params = True
            # litellm prices every response with its own map, twice (milliseconds of CPU:
            # benchmarks/README.md); kvgate bills from its dated book and never reads
            # that figure, so it is not computed.
            Logging.response_cost_calculator = _no_cost  # type: ignore[method-assign]
            for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
                logging.getLogger(name).setLevel(logging.WARNING)
            self._litellm = litellm
        return self._litellm

    @property
    def loaded(self) -> bool:
        """Whether litellm has been imported by ``load``."""
        return self._litellm is not None

    @property
    def version(self) -> str:
        """The installed litellm's version."""
        from importlib.metadata import version

        return version("litellm")

    def arguments(self, request: ProviderRequest) -> dict[str, Any]:
        """litellm's keyword arguments for one call."""
        target = request.target
        body = {k: v for k, v in request.body.items() if k in CHAT_PARAMETERS}
        if target.cache_control and anthropic_family(target.litellm_model):
            mark_stable_prefix(body, target.cache_ttl)
        arguments: dict[str, Any] = {
            **body,
            "model": target.litellm_model,
            "api_key": request.api_key or NO_KEY,
            "timeout": target.timeout_s,
            # One call is one attempt: failover and its records are the gateway's.
            "num_retries": 0,
            "max_retries": 0,
            "drop_params": True,
        }
        if target.base_url is not None:
            arguments["api_base"] = target.base_url
        if request.stream:
            arguments["stream"] = True
            arguments["stream_options"] = {"include_usage": True}
        return arguments

    async def _acompletion(self, request: ProviderRequest) -> Any:
        """litellm's completion (streamed or not); provider errors raised as kvgate's."""
        litellm = self.load()
        try:
            return await litellm.acompletion(**self.arguments(request))
        except Exception as exc:  # litellm raises provider errors of many types
            raise failure(exc, request.target.litellm_model) from exc

    async def complete(self, request: ProviderRequest) -> Reply:
        """One completion, not streamed, usage normalised; provider errors raised as kvgate's."""
        response = await self._acompletion(request)
        body = _dump(response)
        body.pop("usage", None)
        raw_usage = _dump(response.usage) if getattr(response, "usage", None) else None
        choices = body.get("choices") or [{}]
        finish = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
        tier = service_tier({"service_tier": body.get("service_tier"), "usage": raw_usage})
        return Reply(
            body=body,
            usage=from_litellm(raw_usage),
            service_tier=tier,
            finish_reason=str(finish) if finish else None,
            raw_usage=raw_usage,
        )

    async def open_stream(self, request: ProviderRequest) -> ProviderStream:
        """A streamed completion, its first chunk read; provider errors raised as kvgate's."""
        source = await self._acompletion(request)
        stream = ProviderStream(source=source, request=request)
        await stream.start()
        return stream

    def messages_to_chat(
        self, body: Mapping[str, Any], target: ProviderTarget
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """A Messages body as a chat body for ``target``, and the tool names litellm shortened
        (OpenAI allows 64 characters); a body litellm cannot translate is a 400."""
        self.load()
        from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter

        request = {k: v for k, v in body.items() if k not in ("cache_salt", "metadata")}
        metadata = body.get("metadata")
        if isinstance(metadata, dict) and "user_id" in metadata:
            # Anthropic's end user becomes chat's ``user``; the rest is kvgate's or litellm's.
            request["metadata"] = {"user_id": metadata["user_id"]}
        request["model"] = target.litellm_model
        try:
            chat, names = AnthropicAdapter().translate_completion_input_params_with_tool_mapping(
                request, custom_llm_provider=target.provider, api_base=target.base_url
            )
        except Exception as exc:  # litellm's checks raise ValueError, pydantic's, its own...
            said = " ".join(str(exc).split())[:300]
            raise InvalidRequest(f"cannot translate this Messages request: {said}") from None
        if chat is None:
            raise InvalidRequest("cannot translate this Messages request")
        return dict(chat), dict(names)

    def chat_to_message(
        self, body: Mapping[str, Any], usage: Mapping[str, Any] | None, names: dict[str, str]
    ) -> dict[str, Any]:
        """A chat answer (its usage beside it) as Anthropic's Messages answer."""
        self.load()
        from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter
        from litellm.types.utils import ModelResponse

        response = ModelResponse(**{**body, "usage": dict(usage or {})})
        message = AnthropicAdapter().translate_completion_output_params(
            response, tool_name_mapping=names
        )
        return _dump(message)

    def chunks_to_events(
        self, chunks: AsyncIterator[dict[str, Any]], model: str, names: dict[str, str]
    ) -> AsyncIterator[bytes]:
        """A chat stream's chunks as Anthropic's Messages events (message_start ...
        message_stop); a chunk source that raises ends them with an ``event: error``."""
        self.load()
        from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter
        from litellm.types.utils import ModelResponseStream

        async def models() -> AsyncIterator[Any]:
            async for chunk in chunks:
                yield ModelResponseStream(**chunk)

        events = AnthropicAdapter().translate_completion_output_params_streaming(
            models(), model=model, tool_name_mapping=names, is_async=True
        )
        assert events is not None and hasattr(events, "__anext__")
        return events  # type: ignore[return-value]
