"""A record's database row, and the batch insert the writer makes of them.

Kept apart from the recorder so that the database writer's process imports only this,
the models and the record type: not the web stack the recorder's errors come with.
"""

from __future__ import annotations

from typing import Any

from gateway.accounting.records import Record
from gateway.db.models import FINISH_REASON_CHARS, SERVICE_TIER_CHARS
from gateway.db.session import Engine
from gateway.db.writer import insert_requests

REPLACEMENT = "\ufffd"


def fitted(text: str | None, limit: int | None = None) -> str | None:
    """Free text as a column can hold it on every database: a NUL (which Postgres refuses in
    text, and so would refuse the whole row) becomes U+FFFD, and text past ``limit``
    characters is cut to it, its last character an ellipsis."""
    if text is None:
        return None
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    return text


def record_row(record: Record) -> dict[str, Any]:
    """The database row of a record (the free text that came from an upstream or a prompt
    ``fitted`` to its column: a row the database refuses would be a record lost)."""
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
        "finish_reason": fitted(record.finish_reason, FINISH_REASON_CHARS),
        "error": fitted(record.error),
        "uncached_tokens": usage.uncached_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "output_tokens": usage.output_tokens,
        "usage_source": usage.source.value,
        "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        "service_tier": fitted(record.extra.get("service_tier"), SERVICE_TIER_CHARS),
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
        "break_context": fitted(record.break_context),
        "end_user": record.end_user,
        "tags": record.tags or None,
    }


def insert_records(engine: Engine, records: list[Record]) -> None:
    """Insert a batch of records (idempotent by request id; see ``insert_requests``)."""
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        rows.setdefault(record.request_id, record_row(record))
    insert_requests(engine, list(rows.values()))
