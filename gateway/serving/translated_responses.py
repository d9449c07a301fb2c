"""OpenAI's Responses over chat (gateway/serving/translated.py), with litellm's Responses
bridge (gateway/upstream/adapters.py).

    request   the Responses body as chat (``instructions`` as the leading system message,
              input items as messages, function tools and ``tool_choice``,
              ``max_output_tokens`` as ``max_tokens``, ``text.format`` as
              ``response_format``, ``reasoning.effort``)
    answer    the chat answer as a Response (output items: the message, function calls)
    stream    the chat stream's chunks as Responses events (response.created …
              response.output_text.delta … response.completed), passed on as they are
              made; response.completed (or .incomplete) held back until the record is
              durable, then sent with the billed usage

Nothing is stored where the chat goes: a Response made here says ``store: false`` and has
an id of the gateway's; ``previous_response_id`` is refused with a 400, as no earlier
response can be continued there.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

from gateway.accounting.records import Record
from gateway.config import ProviderTarget
from gateway.errors import InvalidRequest, KvgateError, UpstreamError
from gateway.serving.backend import Answer, UpstreamEvents
from gateway.serving.translated_stream import TranslatedStream, event_bytes
from gateway.serving.wires import ResponsesWire
from gateway.upstream.adapters import ResponsesAdapter, ResponsesAsked


class TranslatedResponsesWire(ResponsesWire):
    """A translated Response: billed as the chat call was (its outcome is chat's)."""


WIRE = TranslatedResponsesWire()


def response_id() -> str:
    """A new Response id, in OpenAI's form."""
    return "resp_" + secrets.token_hex(24)


def _as_made_here(response: Any, made: str) -> dict[str, Any]:
    """The Response with the gateway's id, and not stored."""
    return {**(response if isinstance(response, dict) else {}), "id": made, "store": False}


class ResponsesDialect:
    """Responses to and from chat: the request's input and parameters are its state."""

    def __init__(self, adapter: ResponsesAdapter) -> None:
        self.adapter = adapter

    def to_chat(
        self, body: Mapping[str, Any], target: ProviderTarget
    ) -> tuple[dict[str, Any], ResponsesAsked]:
        """The body as chat; ``previous_response_id`` is a 400 (nothing is stored there)."""
        if body.get("previous_response_id"):
            raise InvalidRequest(
                f"previous_response_id cannot be followed on model '{body.get('model')}': "
                f"its target {target.litellm_model} speaks only chat, so its Responses are "
                "translated and none is stored; send the conversation so far as input",
                param="previous_response_id",
            )
        chat, asked = self.adapter.to_chat(body, target)
        for tool in chat.get("tools") or ():
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                kind = tool.get("type") if isinstance(tool, dict) else tool
                raise InvalidRequest(
                    f"tool of type {kind!r} cannot be used on model '{body.get('model')}': its "
                    f"target {target.litellm_model} speaks only chat, which runs functions only",
                    param="tools",
                )
        return chat, asked

    def answer(self, chat: Answer, asked: ResponsesAsked) -> Answer:
        """The chat answer as a Response; billed as the chat was."""
        response = self.adapter.to_response(chat.body, chat.upstream_usage, asked)
        response = _as_made_here(response, response_id())
        return Answer(
            body=response,
            upstream_usage=response.get("usage"),
            outcome=replace(chat.outcome, finish_reason=WIRE.finish_reason(response)),
            wire=WIRE,
        )

    def stream(
        self, chat: UpstreamEvents, target: ProviderTarget, asked: ResponsesAsked
    ) -> TranslatedStream:
        """The chat stream as Responses events."""
        return ResponsesStream(chat, self.adapter, asked)


class ResponsesStream(TranslatedStream):
    """A chat stream's chunks as Responses events."""

    def __init__(
        self, chat: UpstreamEvents, adapter: ResponsesAdapter, asked: ResponsesAsked
    ) -> None:
        super().__init__(chat)
        self.id = response_id()
        self.translated = adapter.to_events(self.chunks(), asked)

    async def events(self) -> AsyncIterator[bytes]:
        """Each event as litellm's bridge makes it, the Response in it given the gateway's
        id; the terminal event kept for ``ending``."""
        async for data in self.translated:
            kind = data.get("type")
            name = kind.encode() if isinstance(kind, str) else b"message"
            if "response" in data:
                data = {**data, "response": _as_made_here(data["response"], self.id)}
            if name in ResponsesWire.TERMINAL:
                self.finish_reason = WIRE.finish_reason(data["response"])
                self.held.append((name, data))
                self.ended = True
            else:
                yield event_bytes(name, data)
        if not self.ended:
            raise self.failure or UpstreamError("provider stream ended before its last event")

    def ending(self, record: Record, *, with_usage: bool) -> bytes:
        """response.completed with the billed usage and cost: once the record is durable."""
        out: list[bytes] = []
        for name, data in self.held:
            response = data["response"]
            response = {**response, "usage": WIRE.billed_usage(response.get("usage"), record)}
            out.append(event_bytes(name, {**data, "response": response}))
        return b"".join(out)

    def error_event(self, error: KvgateError) -> bytes:
        """The error as the Responses stream's ``event: error``."""
        return WIRE.error_event(error)

    async def close_translation(self) -> None:
        """Closes the bridge's stream."""
        await self.translated.aclose()  # type: ignore[attr-defined]
