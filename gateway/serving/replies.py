"""What clients get back, whatever the backend: one usage shape, one ending for streams.

The usage a client sees is the upstream's own (so fields kvgate does not bill on, such as
reasoning-token details, pass through), with the billed classes written over it from the
record: ``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
``prompt_tokens_details.cached_tokens`` and ``.cache_write_tokens``, ``cost`` (a decimal
string, or null when the model has no price) and ``usage_source``.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from gateway.accounting.records import Record
from gateway.errors import KvgateError, error_body
from gateway.upstream import sse


def client_usage(upstream: Any, record: Record) -> dict[str, Any]:
    """The upstream's usage with the record's billed classes and cost written over it."""
    usage = dict(upstream) if isinstance(upstream, dict) else {}
    billed = record.usage
    usage["prompt_tokens"] = billed.prompt_tokens
    usage["completion_tokens"] = billed.output_tokens
    usage["total_tokens"] = billed.total_tokens
    details = usage.get("prompt_tokens_details")
    details = dict(details) if isinstance(details, dict) else {}
    details["cached_tokens"] = billed.cache_read_tokens
    details["cache_write_tokens"] = billed.cache_write_tokens
    usage["prompt_tokens_details"] = details
    usage["cost"] = f"{record.cost.total:f}" if record.priced else None
    usage["usage_source"] = billed.source.value
    return usage


COST_HEADERS = ("x-kvgate-cost", "x-kvgate-cached-tokens")


def cost_headers(record: Record) -> dict[str, str]:
    """``x-kvgate-cost`` (the cost as in ``usage.cost``: a decimal string, absent when the
    model has no price) and ``x-kvgate-cached-tokens``, for clients that read no usage."""
    headers = {"x-kvgate-cached-tokens": str(record.usage.cache_read_tokens)}
    if record.priced:
        headers["x-kvgate-cost"] = f"{record.cost.total:f}"
    return headers


def json_reply(body: dict[str, Any], upstream_usage: Any, record: Record) -> Response:
    """A complete answer: the upstream's body, its usage billed, the cost in headers too.

    (A stream's headers leave before its cost is known: a stream has its cost in its
    usage chunk, and the same headers as trailers where the server sends them.)
    """
    body["usage"] = client_usage(upstream_usage, record)
    return Response(orjson.dumps(body), media_type="application/json", headers=cost_headers(record))


def stream_error(error: KvgateError) -> bytes:
    """The event that ends a stream that broke after its first byte."""
    return b"data: " + error_body(error.message, error.type, code=error.code) + b"\n\n"


def stream_ending(usage_chunk: dict[str, Any] | None, record: Record, *, with_usage: bool) -> bytes:
    """The last events of a finished stream: the billed usage chunk (when the client asked
    for usage) and ``[DONE]``; sent only once the record is durable."""
    if not with_usage:
        return sse.DONE + b"\n\n"
    chunk = dict(usage_chunk or {"object": "chat.completion.chunk"})
    chunk["choices"] = []
    chunk["usage"] = client_usage(chunk.get("usage"), record)
    return sse.encode(chunk) + sse.DONE + b"\n\n"
