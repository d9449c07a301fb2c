"""A record's database row, and the batch insert the writer makes of them.

Kept apart from the recorder so that the database writer's process imports only this,
the models and the record type: not the web stack the recorder's errors come with.
"""

from __future__ import annotations

from typing import Any

from gateway.accounting.records import Record
from gateway.db.session import Engine
from gateway.db.writer import insert_requests


def record_row(record: Record) -> dict[str, Any]:
    """The database row of a record."""
    usage, cost, ceiling = record.usage, record.cost, record.stored_ceiling
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
