"""A litellm stream as OpenAI's SSE events, and the usage it reported once it ended (or
the tokens so far of one that did not): litellm's completion streamed, for the hosted
targets whose chat goes through it (gateway/upstream/providers.py opens it).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from gateway.upstream.chatbody import GENERATED, dump, prompt_estimate, service_tier
from gateway.upstream.failures import failure
from gateway.usage import Usage, UsageSource, from_litellm

if TYPE_CHECKING:
    from gateway.upstream.providers import ProviderRequest

log = logging.getLogger("kvgate.providers")


def now() -> datetime:
    """The time now, in UTC."""
    return datetime.now(UTC)


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
    _response: Any = None  # the provider's httpx response under litellm's stream, if any

    async def start(self) -> None:
        """Wait for the first chunk, so that a provider's failure raises before any response."""
        self._estimate = prompt_estimate(self.request.body)
        # Taken now: litellm lets go of its SDK stream when it ends or is closed.
        self._response = getattr(getattr(self.source, "completion_stream", None), "response", None)
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
        data = dump(chunk)
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
        return dump(latest) if latest is not None else None

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
        let_go_of_request(self._response)
        self._response = None


def let_go_of_request(response: Any) -> None:
    """Break the cycle that keeps a closed stream's request, and its whole serialized body.

    httpx's response and its stream refer to each other. A stream's response lives as long
    as the generation, so by its end the collector has moved it to its oldest generation,
    which only a full collection visits (0.3 s with litellm loaded): sixteen streamed 3.9
    MiB chats left 52-55 MiB resident. Without the cycle, the response, its request and
    the body go as soon as the stream is dropped. A stream litellm reads some other way
    (no OpenAI SDK stream with its httpx response under it) is left as it is.
    """
    import httpx  # litellm's own dependency, loaded with it

    if isinstance(response, httpx.Response):
        response.stream = httpx.ByteStream(b"")
