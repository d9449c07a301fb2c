"""A record's database row, and the batch insert the writer makes of them.

Kept apart from the recorder so that the database writer's process imports only this,
the models and the record type: not the web stack the recorder's errors come with.
"""

from __future__ import annotations

from typing import Any

from gateway.accounting.records import Record
from gateway.db.session import Engine
from gateway.db.writer import insert_requests


def stored_ceiling(record: Record) -> int | None:
    """The hit-rate ceiling a record's row keeps: the router's, raised to what was achieved.

    The ceiling is the prompt tokens whose blocks had been seen before in the request's cache
    scope. The router counts it from the blocks it saw, and that count can fall short of the
    truth: in text mode (no tokenizer) its blocks are character chunks, scaled to tokens;
    replicas also cache the blocks of generated output, which come back as the next turn's
    prompt but were never in a prompt the router hashed; and the router does not see what
    other gateways sent or what replicas kept across its restart. A replica's reported hit is
    proof that those blocks had been computed before, so the ceiling is at least the cached
    tokens the replica reported, in the replica's own tokens: the very figures the achieved
    hit rate uses.

    So every row holds cache_read_tokens <= ceiling_cached_tokens, and every efficiency
    summed over the same rows (a request, an hour, a tenant, a replica, a period) is at
    most 100 % by construction; nothing is clamped where it is shown. Converting the
    reported count into the router's units instead would compare two estimates and still
    miss blocks the router never saw.
    """
    ceiling = record.ceiling_cached_tokens
    return None if ceiling is None else max(ceiling, record.usage.cache_read_tokens)


def record_row(record: Record) -> dict[str, Any]:
    """The database row of a record."""
    usage, cost, ceiling = record.usage, record.cost, stored_ceiling(record)
    return {
        "request_id": record.request_id,
        "tenant_id": record.tenant_id,
        "api_key_id": record.api_key_id,
        "interaction_id": record.interaction_id,
        "attempt": record.attempt,
        "model": record.model,
        "endpoint": record.endpoint,
        "deployment": record.deployment,
        "upstream": record.upstream,
        "policy": record.policy,
        "stream": record.stream,
        "started_at": record.started_at,
        "first_token_at": record.first_token_at,
        "ended_at": record.ended_at,
        "status": record.status.value,
        "finish_reason": record.finish_reason,
        "error": record.error,
        "uncached_tokens": usage.uncached_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "output_tokens": usage.output_tokens,
        "usage_source": usage.source.value,
        "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        "service_tier": record.extra.get("service_tier"),
        "predicted_cached_tokens": record.predicted_cached_tokens,
        "ceiling_cached_tokens": ceiling,
        "ceiling_exact": record.ceiling_exact if ceiling is not None else None,
        "cache_read_host_tokens": record.cache_read_host_tokens,
        "cache_read_disk_tokens": record.cache_read_disk_tokens,
        "price_id": record.price_id,
        "rate_class": record.rate_class,
        "cost_uncached": cost.uncached,
        "cost_cache_read": cost.cache_read,
        "cost_cache_write": cost.cache_write,
        "cost_output": cost.output,
        "cost_total": cost.total,
        "cost_uncached_equivalent": cost.uncached_equivalent,
        "break_tokens": record.break_tokens,
        "lost_tokens": record.lost_tokens,
        "break_early": record.break_early,
        "break_context": record.break_context,
        "end_user": record.end_user,
        "tags": record.tags or None,
    }


def insert_records(engine: Engine, records: list[Record]) -> None:
    """Insert a batch of records (idempotent by request id; see ``insert_requests``)."""
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        rows.setdefault(record.request_id, record_row(record))
    insert_requests(engine, list(rows.values()))
