"""Server-sent events as upstreams send them: split into whole events, usage captured.

Only the few events that can carry what we bill on are parsed as JSON: the usage chunk
and the chunk with a finish reason. Everything else passes through as bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

DONE = b"data: [DONE]"


@dataclass(slots=True)
class StreamState:
    """What a stream has told us so far."""

    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    content_events: int = 0
    saw_done: bool = False
    extra_chunks: list[dict[str, Any]] = field(default_factory=list)


class EventSplitter:
    """Feed raw bytes, get back complete events (each ending in a blank line)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The events this data completes, in order; the rest waits for more (CRLF read as LF)."""
        self._buffer += data
        if b"\r" in self._buffer:
            # CRLF read as LF over the whole buffer: a CRLF can straddle two reads (a CR
            # that ends this read is matched when its LF arrives).
            self._buffer = self._buffer.replace(b"\r\n", b"\n")
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return
            event, self._buffer = self._buffer[: end + 2], self._buffer[end + 2 :]
            yield event

    def rest(self) -> bytes:
        """Whatever is buffered after the last whole event, taken out."""
        rest, self._buffer = self._buffer, b""
        return rest


def payload(event: bytes) -> bytes | None:
    """The data of a one-line ``data:`` event, or None for comments and other fields."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


def inspect(event: bytes, state: StreamState) -> dict[str, Any] | None:
    """Update ``state`` from one event; return the parsed chunk when it is usage-only."""
    data = payload(event)
    if data is None:
        return None
    if data == b"[DONE]":
        state.saw_done = True
        return None
    has_usage = b'"usage":{' in data or b'"usage": {' in data
    has_finish = b'"finish_reason":"' in data or b'"finish_reason": "' in data
    if not (has_usage or has_finish):
        if not _role_only(data):
            state.content_events += 1
        return None
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(chunk, dict):
        return None
    choices = chunk.get("choices")
    if not isinstance(choices, list):  # malformed: passed on, read as no choices
        choices = []
    for choice in choices:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            state.finish_reason = str(choice["finish_reason"])
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        state.usage = usage
    if choices:
        state.content_events += 1
        return None
    if usage is None and not _role_only(data):  # "usage" only deeper in: an ordinary event
        state.content_events += 1
    # Held back (to be priced) only when the chunk's own usage object is all it carries.
    return chunk if isinstance(usage, dict) else None


_EMPTY_CONTENT = (b'"content":""', b'"content": ""', b'"content":null', b'"content": null')


def _role_only(data: bytes) -> bool:
    """The first chat chunk names the role and carries no output token."""
    if b'"role"' not in data:  # a quote inside a string value is escaped: never a false hit
        return False
    return b'"content"' not in data or any(empty in data for empty in _EMPTY_CONTENT)


def encode(chunk: dict[str, Any]) -> bytes:
    """A chunk as one server-sent ``data:`` event."""
    return b"data: " + orjson.dumps(chunk) + b"\n\n"
