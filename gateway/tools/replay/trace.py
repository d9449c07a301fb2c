"""Mooncake traces: one JSON object per line, one request each.

Fields: ``timestamp`` (ms from the start of the trace), ``input_length`` (prompt
tokens), ``output_length`` (generated tokens), ``hash_ids`` (one id per block of
``block_tokens`` prompt tokens, prefix-chained: equal ids mean equal prefixes up to and
including that block). The last block may be partial; only full blocks can be cached.

Two optional fields, absent from Mooncake's traces, carry a request's identity as the
gateway knows it: ``request_id`` (its policy key: random choices and tie-breaks; default
the request's position) and ``interaction_id`` (session affinity; default the request id).
A trace written from recorded traffic keeps them, so a replay breaks ties as the gateway did.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    request_id: str | None = None
    interaction_id: str | None = None

    def full_blocks(self, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int:
        """Blocks the prompt fills completely: the only ones a prefix cache can hold."""
        return min(self.input_length // block_tokens, len(self.hash_ids))

    def cacheable(self, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> tuple[int, ...]:
        """The hash ids of the full blocks."""
        return self.hash_ids[: self.full_blocks(block_tokens)]


class TraceError(ValueError):
    """A trace line that is not a Mooncake request."""


def load_trace(path: Path, *, limit: int | None = None) -> list[TraceRequest]:
    """The trace's requests in file order (which is arrival order), at most ``limit``."""
    return list(iter_trace(path, limit=limit))


def iter_trace(path: Path, *, limit: int | None = None) -> Iterator[TraceRequest]:
    """Requests one by one; blank lines are skipped."""
    if limit is not None and limit <= 0:
        return
    count = 0
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            yield _parse(line, path, number)
            count += 1
            if limit is not None and count >= limit:
                return


def _parse(line: bytes, path: Path, number: int) -> TraceRequest:
    try:
        data = orjson.loads(line)
        request = TraceRequest(
            timestamp_ms=int(data["timestamp"]),
            input_length=int(data["input_length"]),
            output_length=int(data["output_length"]),
            hash_ids=tuple(int(h) for h in data["hash_ids"]),
            request_id=_optional_text(data, "request_id"),
            interaction_id=_optional_text(data, "interaction_id"),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise TraceError(f"{path}:{number}: not a Mooncake request: {error}") from error
    if request.input_length < 0 or request.output_length < 0:
        raise TraceError(f"{path}:{number}: negative length")
    return request


def _optional_text(data: dict[str, object], name: str) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name!r} must be a string")
    return value
