"""What every translated stream shares (gateway/serving/translated.py): the chat stream
under it read as chunk objects, its usage chunk last; its outcome (the chat's: billed by the
provider's usage), with the translated wire's own finish reason; and closing both.

A translated wire's events are made chunk by chunk by litellm (gateway/upstream/
adapters.py); each subclass passes them on, keeps its closing events for ``ending``, and
says how a break is told.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime
from typing import Any

import orjson

from gateway.accounting.records import Record
from gateway.errors import KvgateError, UpstreamError
from gateway.serving.backend import UpstreamEvents
from gateway.serving.context import Outcome
from gateway.upstream import sse

log = logging.getLogger("kvgate.providers")


class TranslatedStream:
    """A chat stream's chunks as another wire's events; its usage is the chat stream's."""

    def __init__(self, chat: UpstreamEvents) -> None:
        self.chat = chat
        self.failure: UpstreamError | None = None
        self.finish_reason: str | None = None  # the translated wire's
        self.held: list[tuple[bytes, dict[str, Any]]] = []  # closing events (name, data)
        self.ended = False

    @property
    def first_token_at(self) -> datetime | None:
        """When the chat stream's first chunk arrived."""
        return self.chat.first_token_at

    @property
    def usage_chunk(self) -> dict[str, Any] | None:
        """None: the usage goes out in the translated wire's closing events."""
        return None

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The chat stream's chunks, its held usage chunk last (where litellm puts the
        usage in the closing events); a failure is kept to be raised as it was."""
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

    def events(self) -> AsyncIterator[bytes]:
        """The translated wire's events, its closing ones kept for ``ending``."""
        raise NotImplementedError

    def ending(self, record: Record, *, with_usage: bool) -> bytes:
        """The closing events with the billed usage: once the record is durable."""
        raise NotImplementedError

    def error_event(self, error: KvgateError) -> bytes:
        """The translated wire's error event."""
        raise NotImplementedError

    def outcome(self, *, ended: bool, error: str | None) -> Outcome:
        """The chat stream's outcome (its provider's usage), the translated finish reason."""
        outcome = self.chat.outcome(ended=ended, error=error)
        return replace(outcome, finish_reason=self.finish_reason or outcome.finish_reason)

    async def close_translation(self) -> None:
        """Close litellm's event source (the subclass's)."""

    async def close(self) -> None:
        """Closes the translation and the chat call under it."""
        try:
            await self.close_translation()
        except Exception:  # closing a broken stream must not hide why it broke
            log.debug("closing a translated stream failed", exc_info=True)
        await self.chat.close()


def event_bytes(name: bytes, data: dict[str, Any]) -> bytes:
    """One server-sent event, named."""
    return b"event: " + name + b"\ndata: " + orjson.dumps(data) + b"\n\n"
