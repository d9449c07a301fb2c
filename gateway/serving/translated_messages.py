"""Anthropic's Messages over chat (gateway/serving/translated.py), with litellm's adapter
(gateway/upstream/adapters.py).

    request   the Messages body as chat (system, content blocks, tools, tool_choice,
              stop_sequences, thinking, ``metadata.user_id`` as ``user``)
    answer    the chat answer as a Messages answer (content blocks, ``stop_reason``)
    stream    the chat stream's chunks as Anthropic's events (message_start,
              content_block_start / delta / stop, message_delta, message_stop), passed on
              as they are made; message_delta and message_stop held back until the record
              is durable, then sent with the billed usage

The client sees the billed usage in Anthropic's convention (``input_tokens`` without the
cache reads and writes, which are beside it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

import orjson

from gateway.accounting.records import Record
from gateway.config import ProviderTarget
from gateway.errors import KvgateError, UpstreamError
from gateway.serving.backend import Answer, UpstreamEvents
from gateway.serving.translated_stream import TranslatedStream, event_bytes
from gateway.serving.wires import MessagesWire
from gateway.upstream import sse
from gateway.upstream.adapters import MessagesAdapter


class TranslatedWire(MessagesWire):
    """A translated Messages answer: billed as the chat call was (its outcome is chat's)."""


WIRE = TranslatedWire()


def event_name(event: bytes) -> bytes:
    """An event's ``event:`` field (litellm's adapter writes it first); empty if none."""
    return event[6 : event.find(b"\n")].strip() if event.startswith(b"event:") else b""


def event_data(event: bytes) -> dict[str, Any]:
    """An event's ``data:`` object; empty if it has none."""
    payload = sse.payload(event)
    data = orjson.loads(payload) if payload else None
    return data if isinstance(data, dict) else {}


def _stop_reason(message: dict[str, Any]) -> str | None:
    reason = message.get("stop_reason")
    return reason if isinstance(reason, str) else None


class MessagesDialect:
    """Messages to and from chat: the tool names litellm shortened are its state."""

    def __init__(self, adapter: MessagesAdapter) -> None:
        self.adapter = adapter

    def to_chat(
        self, body: Mapping[str, Any], target: ProviderTarget
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The body as chat, and the tool names litellm shortened (OpenAI allows 64)."""
        return self.adapter.to_chat(body, target)

    def answer(self, chat: Answer, names: dict[str, str]) -> Answer:
        """The chat answer as a Message; billed as the chat was."""
        message = self.adapter.to_message(chat.body, chat.upstream_usage, names)
        return Answer(
            body=message,
            upstream_usage=message.get("usage"),
            outcome=replace(chat.outcome, finish_reason=_stop_reason(message)),
            wire=WIRE,
        )

    def stream(
        self, chat: UpstreamEvents, target: ProviderTarget, names: dict[str, str]
    ) -> TranslatedStream:
        """The chat stream as Anthropic's events."""
        return MessagesStream(chat, self.adapter, target.provider_model, names)


class MessagesStream(TranslatedStream):
    """A chat stream's chunks as Anthropic's events."""

    def __init__(
        self, chat: UpstreamEvents, adapter: MessagesAdapter, model: str, names: dict[str, str]
    ) -> None:
        super().__init__(chat)
        self.translated = adapter.to_events(self.chunks(), model, names)

    async def events(self) -> AsyncIterator[bytes]:
        """Anthropic's events as the adapter makes them; message_delta and message_stop
        kept for ``ending``; an adapter's error event raised as the failure it was."""
        splitter = sse.EventSplitter()
        async for data in self.translated:
            passing: list[bytes] = []
            for event in splitter.feed(data):
                name = event_name(event)
                if name == b"error":
                    error = event_data(event).get("error")
                    said = error.get("message") if isinstance(error, dict) else None
                    raise self.failure or UpstreamError(f"provider stream broke: {said}")
                if name in MessagesWire.HELD:
                    data_of = event_data(event)
                    if name == b"message_delta":
                        delta = data_of.get("delta")
                        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
                        self.finish_reason = reason if isinstance(reason, str) else None
                    else:
                        self.ended = True
                    self.held.append((name, data_of))
                else:
                    passing.append(event)
            if passing:
                yield b"".join(passing)
        if not self.ended:
            raise self.failure or UpstreamError("provider stream ended before its last event")

    def ending(self, record: Record, *, with_usage: bool) -> bytes:
        """message_delta with the billed usage, and message_stop: once the record is durable."""
        out: list[bytes] = []
        for name, data in self.held:
            if name == b"message_delta":
                data = {**data, "usage": WIRE.billed_usage(data.get("usage"), record)}
            out.append(event_bytes(name, data))
        return b"".join(out)

    def error_event(self, error: KvgateError) -> bytes:
        """The error as Anthropic's ``event: error``."""
        return WIRE.error_event(error)

    async def close_translation(self) -> None:
        """Closes the adapter's stream."""
        await self.translated.aclose()  # type: ignore[attr-defined]
