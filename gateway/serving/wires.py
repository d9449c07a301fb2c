"""The wires other than chat's: how embeddings, Responses and Messages answers are read,
billed and streamed.

Chat and completions keep their own path (gateway/serving/replies.py, the vLLM stream of
gateway/serving/vllm.py); each wire here says, for its endpoint:

    outcome(body)         a complete answer's usage (normalised: gateway/usage.py) and
                          finish reason
    reply(body, record)   the answer with the billed usage written over the upstream's,
                          ``usage.cost`` added, and the cost headers
    stream(...)           (Responses, Messages) the event stream passed through as it
                          arrives, its closing events held back until the record is
                          durable and then sent with the billed usage
    error_event(error)    the event that ends a stream that broke, in the wire's shape

    Responses  usage ``input_tokens`` (cached inside), ``output_tokens``; the stream's
               ``response.completed`` (or ``.incomplete`` / ``.failed``) is held back
    Messages   usage in Anthropic's convention; the stream's ``message_delta`` (the final
               usage) and ``message_stop`` are held back

``WIRES`` read vLLM's answers; ``PROVIDER_WIRES`` the providers' own (OpenAI's Responses,
Anthropic's Messages): the same, but for the service tier they report, which is billed,
and Anthropic's cache writes, which vLLM's "creations" are not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import orjson
from starlette.responses import Response

from gateway.accounting.records import Record, Status
from gateway.errors import KvgateError, UpstreamError, anthropic_type
from gateway.serving.calls import Endpoint
from gateway.serving.context import Outcome, now
from gateway.serving.replies import cost_headers
from gateway.upstream import sse
from gateway.upstream.vllm import UpstreamStream
from gateway.usage import (
    Usage,
    UsageSource,
    from_anthropic,
    from_openai,
    from_responses,
    from_vllm_anthropic,
)


def _billed(usage: dict[str, Any], record: Record) -> dict[str, Any]:
    """An answer's usage with the gateway's cost (None unpriced) and its tokens' source."""
    usage["cost"] = f"{record.cost.total:f}" if record.priced else None
    usage["usage_source"] = record.usage.source.value
    return usage


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


class Wire:
    """One endpoint's answers; the base is for answers that are not billed (count_tokens)."""

    anthropic = False

    def usage(self, upstream: Any) -> Usage:
        """The usage as the upstream reported it, normalised."""
        return Usage.missing()

    def billed_usage(self, upstream: Any, record: Record) -> dict[str, Any]:
        """The upstream's usage with the record's billed classes and cost written over it."""
        return _dict(upstream)

    def finish_reason(self, body: dict[str, Any]) -> str | None:
        """Why the answer ended; None for answers that do not say."""
        return None

    def tier(self, answer: dict[str, Any]) -> str | None:
        """The service tier the answer says it was served in (billed at its rates); None
        where the upstream's tier means nothing to billing (vLLM's)."""
        return None

    def outcome(self, body: dict[str, Any]) -> Outcome:
        """A complete answer's outcome."""
        return Outcome(
            status=Status.COMPLETED,
            usage=self.usage(body.get("usage")),
            finish_reason=self.finish_reason(body),
            service_tier=self.tier(body),
        )

    def reply(self, body: dict[str, Any], record: Record | None) -> Response:
        """The answer to send: billed (when recorded), with the cost headers."""
        if record is None:
            return Response(orjson.dumps(body), media_type="application/json")
        body["usage"] = self.billed_usage(body.get("usage"), record)
        return Response(
            orjson.dumps(body), media_type="application/json", headers=cost_headers(record)
        )

    def error_event(self, error: KvgateError) -> bytes:
        """The event that ends a stream that broke after its first byte."""
        data = {"type": "error", "code": error.code, "message": error.message, "param": None}
        return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"


class EmbeddingsWire(Wire):
    """``/v1/embeddings``: ``usage.prompt_tokens`` (vLLM reports no cached tokens here)."""

    def usage(self, upstream: Any) -> Usage:
        """The answer's usage, as kvgate counts tokens."""
        return from_openai(upstream if isinstance(upstream, dict) else None)

    def billed_usage(self, upstream: Any, record: Record) -> dict[str, Any]:
        """The upstream's usage with the billed prompt and total tokens, and the cost."""
        usage = _dict(upstream)
        usage["prompt_tokens"] = record.usage.prompt_tokens
        usage["total_tokens"] = record.usage.total_tokens
        return _billed(usage, record)


class ResponsesWire(Wire):
    """``/v1/responses``: OpenAI's Responses API."""

    TERMINAL = frozenset({b"response.completed", b"response.incomplete", b"response.failed"})

    def usage(self, upstream: Any) -> Usage:
        """The Responses usage, as kvgate counts tokens."""
        return from_responses(upstream if isinstance(upstream, dict) else None)

    def billed_usage(self, upstream: Any, record: Record) -> dict[str, Any]:
        """The upstream's usage rewritten to the billed tokens, with the cost."""
        billed, usage = record.usage, _dict(upstream)
        usage["input_tokens"] = billed.prompt_tokens
        details = _dict(usage.get("input_tokens_details"))
        details["cached_tokens"] = billed.cache_read_tokens
        details["cache_write_tokens"] = billed.cache_write_tokens
        usage["input_tokens_details"] = details
        usage["output_tokens"] = billed.output_tokens
        usage["output_tokens_details"] = _dict(usage.get("output_tokens_details")) or {
            "reasoning_tokens": 0
        }
        usage["total_tokens"] = billed.total_tokens
        return _billed(usage, record)

    def finish_reason(self, body: dict[str, Any]) -> str | None:
        """The reason the response is incomplete, if it says one; else its status."""
        incomplete = body.get("incomplete_details")
        if isinstance(incomplete, dict) and isinstance(incomplete.get("reason"), str):
            return str(incomplete["reason"])
        status = body.get("status")
        return status if isinstance(status, str) else None


class MessagesWire(Wire):
    """``/v1/messages``: Anthropic's Messages API (as vLLM serves it)."""

    anthropic = True
    HELD = frozenset({b"message_delta", b"message_stop"})

    def usage(self, upstream: Any) -> Usage:
        """The Messages usage (as vLLM reports it), as kvgate counts tokens."""
        return from_vllm_anthropic(upstream if isinstance(upstream, dict) else None)

    def billed_usage(self, upstream: Any, record: Record) -> dict[str, Any]:
        """The upstream's usage rewritten to the billed token classes, with the cost."""
        billed, usage = record.usage, _dict(upstream)
        usage["input_tokens"] = billed.uncached_tokens
        usage["cache_read_input_tokens"] = billed.cache_read_tokens
        usage["cache_creation_input_tokens"] = billed.cache_write_tokens
        usage["output_tokens"] = billed.output_tokens
        return _billed(usage, record)

    def finish_reason(self, body: dict[str, Any]) -> str | None:
        """The answer's ``stop_reason``, if it has one."""
        reason = body.get("stop_reason")
        return reason if isinstance(reason, str) else None

    def error_event(self, error: KvgateError) -> bytes:
        """An error as Anthropic's ``event: error`` server-sent event."""
        data = {"type": "error", "error": {"type": anthropic_type(error), "message": error.message}}
        return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"


def _tier(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class ProviderResponsesWire(ResponsesWire):
    """OpenAI's own ``/v1/responses``: its reported ``service_tier`` is billed."""

    def tier(self, answer: dict[str, Any]) -> str | None:
        """The response's ``service_tier`` (``default``, ``priority``, ``flex``)."""
        return _tier(answer.get("service_tier"))


class ProviderMessagesWire(MessagesWire):
    """Anthropic's own ``/v1/messages``: cache writes are writes (5-minute and 1-hour),
    billed at their rates; the tier is in the usage."""

    def usage(self, upstream: Any) -> Usage:
        """Anthropic's usage: reads and writes on top of ``input_tokens``."""
        return from_anthropic(upstream if isinstance(upstream, dict) else None)

    def billed_usage(self, upstream: Any, record: Record) -> dict[str, Any]:
        """As vLLM's, with the 5m / 1h breakdown of the writes where Anthropic gave one."""
        usage = super().billed_usage(upstream, record)
        if isinstance(usage.get("cache_creation"), dict):
            billed = record.usage
            usage["cache_creation"] = {
                **usage["cache_creation"],
                "ephemeral_5m_input_tokens": billed.cache_write_tokens
                - billed.cache_write_1h_tokens,
                "ephemeral_1h_input_tokens": billed.cache_write_1h_tokens,
            }
        return usage

    def tier(self, answer: dict[str, Any]) -> str | None:
        """The ``service_tier`` Anthropic reports in the usage (``standard``, ``priority``)."""
        return _tier(_dict(answer.get("usage")).get("service_tier"))


WIRES: dict[Endpoint, Wire] = {
    Endpoint.EMBEDDINGS: EmbeddingsWire(),
    Endpoint.RESPONSES: ResponsesWire(),
    Endpoint.MESSAGES: MessagesWire(),
    Endpoint.COUNT_TOKENS: Wire(),
}
# The same wires spoken by the providers themselves (gateway/serving/passthrough.py).
PROVIDER_WIRES: dict[Endpoint, Wire] = {
    **WIRES,
    Endpoint.RESPONSES: ProviderResponsesWire(),
    Endpoint.MESSAGES: ProviderMessagesWire(),
}


def _event_name(event: bytes) -> bytes:
    """An event's ``event:`` field (empty when it has none)."""
    if event.startswith(b"event:"):
        return event[6 : event.find(b"\n")].strip()
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            return line[6:].strip()
    return b""


class WireStream:
    """A Responses or Messages stream (a replica's, or a provider's on its own wire):
    events passed on as they arrive, the closing ones held back; usage read from them."""

    def __init__(
        self,
        upstream: UpstreamStream,
        wire: Wire,
        *,
        prompt_chars: int,
        rename: Callable[[str], str] | None = None,
        previous: tuple[str, str] | None = None,
    ) -> None:
        self.upstream = upstream
        self.wire = wire
        self.prompt_chars = prompt_chars
        # Responses: the id to pass on for the response's (once response.created names
        # it), and for the one it continues (previous): swapped in every event.
        self.rename = rename
        self.swaps: list[tuple[bytes, bytes]] = [] if previous is None else [_quoted(previous)]
        self.first_token_at: datetime | None = None
        self.usage_chunk: dict[str, Any] | None = None  # chat's; never set here
        self.held: list[tuple[bytes, dict[str, Any]]] = []  # (event name, its data)
        self.usage: dict[str, Any] | None = None
        self.finish: str | None = None
        self.tier: str | None = None
        self.content_events = 0
        self.ended = False

    async def events(self) -> AsyncIterator[bytes]:
        """The events of each read, together; the closing ones kept for ``ending``."""
        splitter = sse.EventSplitter()
        async for data in self.upstream.chunks():
            passing: list[bytes] = []
            for event in splitter.feed(data):
                if self.first_token_at is None:
                    self.first_token_at = now()
                if not self._inspect(event):
                    passing.append(event)
            if passing:
                yield self._swapped(b"".join(passing))
        if not self.ended:
            raise UpstreamError("upstream stream ended before its closing event")

    def _inspect(self, event: bytes) -> bool:
        """Read one event; True when it is held back."""
        name = _event_name(event)
        if name.endswith(b"delta") and name != b"message_delta":
            self.content_events += 1
            return False
        if isinstance(self.wire, ResponsesWire):
            if name == b"response.created" and self.rename is not None:
                created = _data(event).get("response")
                if isinstance(created, dict) and isinstance(created.get("id"), str):
                    self.swaps.append(_quoted((created["id"], self.rename(created["id"]))))
            if name in ResponsesWire.TERMINAL:
                data = _data(event)
                response = _dict(data.get("response"))
                self.usage = _dict(response.get("usage")) or None
                self.finish = self.wire.finish_reason(response)
                self.tier = self.wire.tier(response)
                self.held.append((name, data))
                self.ended = True
                return True
            return False
        if name == b"message_start":
            message = _dict(_data(event).get("message"))
            self.usage = _dict(message.get("usage")) or None
            self.tier = self.wire.tier(message)
        elif name in MessagesWire.HELD:
            data = _data(event)
            if name == b"message_delta":
                self.usage = {**(self.usage or {}), **_dict(data.get("usage"))}
                reason = _dict(data.get("delta")).get("stop_reason")
                self.finish = reason if isinstance(reason, str) else self.finish
            else:
                self.ended = True
            self.held.append((name, data))
            return True
        return False

    def outcome(self, *, ended: bool, error: str | None) -> Outcome:
        """Reported usage once the closing event came; else an estimate, marked so."""
        if self.usage is not None and (ended or not isinstance(self.wire, ResponsesWire)):
            usage = self.wire.usage(self.usage)
            if not ended:  # Messages: the input was reported at the start; output so far
                output = max(usage.output_tokens, self.content_events)
                usage = replace(usage, output_tokens=output, source=UsageSource.ESTIMATED)
        else:
            usage = Usage.estimated(self.prompt_chars, self.content_events)
        return Outcome(
            status=Status.COMPLETED if ended else Status.FAILED,
            usage=usage,
            first_token_at=self.first_token_at,
            finish_reason=self.finish,
            service_tier=self.tier,
            error=error,
        )

    def ending(self, record: Record, *, with_usage: bool) -> bytes:
        """The held closing events, with the billed usage (sent once the record is durable)."""
        out: list[bytes] = []
        for name, data in self.held:
            if name in ResponsesWire.TERMINAL:
                response = _dict(data.get("response"))
                response["usage"] = self.wire.billed_usage(response.get("usage"), record)
                data = {**data, "response": response}
            elif name == b"message_delta":
                data = {**data, "usage": self.wire.billed_usage(data.get("usage"), record)}
            out.append(b"event: " + name + b"\ndata: " + orjson.dumps(data) + b"\n\n")
        return self._swapped(b"".join(out))

    def _swapped(self, events: bytes) -> bytes:
        for old, new in self.swaps:
            events = events.replace(old, new)
        return events

    def error_event(self, error: KvgateError) -> bytes:
        """The error as the wire's own error event."""
        return self.wire.error_event(error)

    async def close(self) -> None:
        """Close the connection: cancels the replica's request if it is still running."""
        await self.upstream.close()


def _quoted(ids: tuple[str, str]) -> tuple[bytes, bytes]:
    """An (old, new) id pair as JSON strings, for swapping in events."""
    old, new = ids
    return b'"' + old.encode() + b'"', b'"' + new.encode() + b'"'


def _data(event: bytes) -> dict[str, Any]:
    payload = sse.payload(event)
    if payload is None:
        return {}
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}
