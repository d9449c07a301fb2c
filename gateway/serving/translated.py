"""Anthropic's Messages wire on hosted targets that speak only OpenAI's chat, translated
with litellm's adapter (gateway/upstream/providers.py): the hosted backend's third way.

    request   the Messages body as chat (system, content blocks, tools, tool_choice,
              stop_sequences, thinking, ``metadata.user_id`` as ``user``), then sent as
              any chat to that target is: over its own OpenAI wire (chatwire.py) or
              through litellm's completion
    answer    the chat answer as a Messages answer (content blocks, ``stop_reason``)
    stream    the chat stream's chunks as Anthropic's events (message_start,
              content_block_start / delta / stop, message_delta, message_stop), passed on
              as they are made; message_delta and message_stop held back until the record
              is durable, then sent with the billed usage

The usage billed is the chat call's, read in the provider's own convention, so a Messages
request costs exactly what the same chat to the same target does; the client sees it in
Anthropic's convention (``input_tokens`` without the cache reads and writes, which are
beside it). A failure before the answer fails over like chat's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import orjson

from gateway.accounting.records import Record
from gateway.config import ProviderTarget
from gateway.errors import KvgateError, UpstreamError
from gateway.serving.backend import Answer, UpstreamEvents
from gateway.serving.calls import Call, Endpoint
from gateway.serving.context import Outcome
from gateway.serving.wires import MessagesWire
from gateway.upstream import sse
from gateway.upstream.providers import ProviderFailure, Providers

log = logging.getLogger("kvgate.providers")


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


class Translation:
    """Messages over chat for the hosted backend; litellm is loaded at its first use."""

    def __init__(self, providers: Providers) -> None:
        self.providers = providers
        self._loading = asyncio.Lock()
        self._loaded = False

    async def ready(self) -> None:
        """litellm loaded (seconds, once: off the loop, before the first translation)."""
        if self._loaded:
            return
        async with self._loading:
            if not self._loaded:
                try:
                    await asyncio.to_thread(self.providers.load)
                except ImportError as exc:  # kvgate without its providers extra
                    raise ProviderFailure(
                        f"Messages for this model are translated by litellm, which is not "
                        f"installed (pip install 'kvgate[providers]'): {exc}",
                        status=None,
                        retryable=True,  # a later target may speak Anthropic's wire itself
                    ) from exc
                self._loaded = True
                log.info("litellm %s loaded to translate Messages", self.providers.version)

    def chat(self, call: Call, target: ProviderTarget) -> tuple[Call, dict[str, str]]:
        """The call as chat to ``target``, and the tool names litellm shortened."""
        body, names = self.providers.messages_to_chat(call.body, target)
        # Anthropic's headers (version, betas) mean nothing to a chat provider.
        return replace(call, endpoint=Endpoint.CHAT, body=body, wire_headers=()), names

    async def send(
        self,
        call: Call,
        target: ProviderTarget,
        chat: Callable[[Call, ProviderTarget], Awaitable[Answer]],
    ) -> Answer:
        """One chat call, its answer as Messages; billed as the chat was."""
        asked, names = self.chat(call, target)
        answer = await chat(asked, target)
        message = self.providers.chat_to_message(answer.body, answer.upstream_usage, names)
        return Answer(
            body=message,
            upstream_usage=message.get("usage"),
            outcome=replace(answer.outcome, finish_reason=_stop_reason(message)),
            wire=WIRE,
        )

    async def open(
        self,
        call: Call,
        target: ProviderTarget,
        chat: Callable[[Call, ProviderTarget], Awaitable[UpstreamEvents]],
    ) -> TranslatedStream:
        """One chat stream, open (it fails over until then), its events as Messages'."""
        asked, names = self.chat(call, target)
        stream = await chat(asked, target)
        return TranslatedStream(stream, self.providers, target.provider_model, names)


class TranslatedStream:
    """A chat stream's chunks as Anthropic's events; its usage is the chat stream's."""

    def __init__(
        self, chat: UpstreamEvents, providers: Providers, model: str, names: dict[str, str]
    ) -> None:
        self.chat = chat
        self.translated = providers.chunks_to_events(self._chunks(), model, names)
        self.held: list[tuple[bytes, dict[str, Any]]] = []
        self.failure: UpstreamError | None = None
        self.stop_reason: str | None = None
        self.ended = False

    @property
    def first_token_at(self) -> datetime | None:
        """When the chat stream's first chunk arrived."""
        return self.chat.first_token_at

    @property
    def usage_chunk(self) -> dict[str, Any] | None:
        """None: the usage goes out in message_delta."""
        return None

    async def _chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The chat stream's chunks, its held usage chunk last (litellm's adapter puts it
        in message_delta); a failure is kept to be raised as it was."""
        splitter = sse.EventSplitter()
        try:
            async for data in self.chat.events():
                for event in splitter.feed(data):
                    payload = sse.payload(event)
                    if payload is None or payload == b"[DONE]":
                        continue
                    chunk = orjson.loads(payload)
                    if isinstance(chunk, dict):
                        yield chunk
        except UpstreamError as exc:
            self.failure = exc
            raise
        if self.chat.usage_chunk is not None:
            yield self.chat.usage_chunk

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
                        self.stop_reason = reason if isinstance(reason, str) else None
                    else:
                        self.ended = True
                    self.held.append((name, data_of))
                else:
                    passing.append(event)
            if passing:
                yield b"".join(passing)
        if not self.ended:
            raise self.failure or UpstreamError("provider stream ended before its last event")

    def outcome(self, *, ended: bool, error: str | None) -> Outcome:
        """The chat stream's outcome (its provider's usage), Anthropic's stop reason."""
        outcome = self.chat.outcome(ended=ended, error=error)
        return replace(outcome, finish_reason=self.stop_reason or outcome.finish_reason)

    def ending(self, record: Record, *, with_usage: bool) -> bytes:
        """message_delta with the billed usage, and message_stop: once the record is durable."""
        out: list[bytes] = []
        for name, data in self.held:
            if name == b"message_delta":
                data = {**data, "usage": WIRE.billed_usage(data.get("usage"), record)}
            out.append(b"event: " + name + b"\ndata: " + orjson.dumps(data) + b"\n\n")
        return b"".join(out)

    def error_event(self, error: KvgateError) -> bytes:
        """The error as Anthropic's ``event: error``."""
        return WIRE.error_event(error)

    async def close(self) -> None:
        """Closes the adapter's stream and the chat call under it."""
        try:
            await self.translated.aclose()  # type: ignore[attr-defined]
        except Exception:  # closing a broken stream must not hide why it broke
            log.debug("closing litellm's Messages stream failed", exc_info=True)
        await self.chat.close()
