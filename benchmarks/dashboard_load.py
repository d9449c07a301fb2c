"""The fast load for the dashboard benchmark: COPY the records in, then build the rollups
in SQL, so 10,000,000 records load in minutes rather than hours.

    records ──record_row──▶ COPY requests (secondary indexes dropped, made again after)
    requests ──INSERT … SELECT … GROUP BY──▶ usage_hours, replica_hours, ttft_hours,
                                              break_hours, deployment_hours,
                                              interactions, interaction_cells,
                                              statement_lines, statement_cells

Each statement computes what ``gateway/db/writer/rollups.py`` folds in record by record,
and tests/test_dashboard_load.py checks that both give every rollup row for row the same.
One choice is the writer's by order: a cell's ``completed_cells`` (and
``priced_completed_cells``) count goes to the usage row of the attempt that completed it
first in insert order. Here that is the cell's smallest request id, which is insert order
for records whose ids grow as they are written (the benchmark's ``req_00000001`` …).

Postgres only (``date_trunc`` with a time zone, ``FILTER``, ``COPY``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from gateway.accounting.records import Record
from gateway.accounting.store import record_row
from gateway.db.writer import deployments, lines
from gateway.db.writer.rollups import BUCKETS_PER_DOUBLING, HIGHEST_BUCKET, LOWEST_BUCKET

HOUR = "date_trunc('hour', started_at, 'UTC')"
PROMPT = "(uncached_tokens + cache_read_tokens + cache_write_tokens)"
HAS_CEILING = "ceiling_cached_tokens IS NOT NULL"
# rollups.ttft_bucket: floor(8 log2(ms)), clamped; in numeric, so that a TTFT of exactly a
# power of two milliseconds falls in the bucket it starts, as Python's log2 puts it.
MICROS = "((extract(epoch FROM first_token_at) - extract(epoch FROM started_at)) * 1000000)"
BUCKET = (
    f"CASE WHEN {MICROS} <= 0 THEN {LOWEST_BUCKET} ELSE least(greatest("
    f"floor({BUCKETS_PER_DOUBLING} * log(2.0, {MICROS} / 1000))::int, "
    f"{LOWEST_BUCKET}), {HIGHEST_BUCKET}) END"
)

CELLS = f"""
CREATE TEMPORARY TABLE load_cells ON COMMIT DROP AS
SELECT tenant_id, interaction_id, model, {HOUR} AS hour,
       min(request_id COLLATE "C") AS first_id,
       min(request_id COLLATE "C") FILTER (WHERE price_id IS NOT NULL) AS first_priced_id
FROM requests WHERE status = 'completed'
GROUP BY tenant_id, interaction_id, model, {HOUR}
"""

INTERACTIONS = """
INSERT INTO interactions (tenant_id, interaction_id, cells)
SELECT tenant_id, interaction_id, count(*) FROM load_cells GROUP BY tenant_id, interaction_id
"""

INTERACTION_CELLS = """
INSERT INTO interaction_cells (tenant_id, interaction_id, model, hour, spans, priced)
SELECT c.tenant_id, c.interaction_id, c.model, c.hour, i.cells > 1,
       c.first_priced_id IS NOT NULL
FROM load_cells c JOIN interactions i USING (tenant_id, interaction_id)
"""

USAGE_HOURS = f"""
WITH firsts AS (
    SELECT request_id, true AS first_cell, false AS first_priced FROM load_cells
    JOIN requests ON request_id = first_id
    UNION ALL
    SELECT request_id, false, true FROM load_cells
    JOIN requests ON request_id = first_priced_id
), marks AS (
    SELECT request_id, bool_or(first_cell) AS first_cell, bool_or(first_priced) AS first_priced
    FROM firsts GROUP BY request_id
)
INSERT INTO usage_hours (
    hour, tenant_id, model, price_id, status, requests,
    uncached_tokens, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens,
    output_tokens, cost_uncached, cost_cache_read, cost_cache_write, cost_output,
    cost_total, cost_uncached_equivalent, completed_cells, priced_completed_cells,
    ceiling_requests, ceiling_prompt_tokens, ceiling_cache_read_tokens,
    ceiling_cached_tokens, exact_ceiling_requests, avoidable_miss_tokens)
SELECT {HOUR}, tenant_id, model, coalesce(price_id, ''), status, count(*),
    sum(uncached_tokens), sum(cache_read_tokens), sum(cache_write_tokens),
    sum(cache_write_1h_tokens), sum(output_tokens), sum(cost_uncached),
    sum(cost_cache_read), sum(cost_cache_write), sum(cost_output), sum(cost_total),
    sum(cost_uncached_equivalent),
    count(*) FILTER (WHERE marks.first_cell), count(*) FILTER (WHERE marks.first_priced),
    count(ceiling_cached_tokens),
    coalesce(sum({PROMPT}) FILTER (WHERE {HAS_CEILING}), 0),
    coalesce(sum(cache_read_tokens) FILTER (WHERE {HAS_CEILING}), 0),
    coalesce(sum(ceiling_cached_tokens), 0),
    count(*) FILTER (WHERE {HAS_CEILING} AND ceiling_exact),
    coalesce(sum(greatest(ceiling_cached_tokens - cache_read_tokens, 0)), 0)
FROM requests LEFT JOIN marks USING (request_id)
GROUP BY {HOUR}, tenant_id, model, coalesce(price_id, ''), status
"""

REPLICA_HOURS = f"""
INSERT INTO replica_hours (
    hour, model, upstream, requests, failed_requests, prompt_tokens, cache_read_tokens,
    output_tokens, predicted_requests, predicted_cached_tokens, predicted_cache_read_tokens,
    ceiling_requests, ceiling_prompt_tokens, ceiling_cache_read_tokens,
    ceiling_cached_tokens, exact_ceiling_requests, tier_requests, tier_cache_read_tokens,
    host_cached_tokens, disk_cached_tokens)
SELECT {HOUR}, model, upstream, count(*), count(*) FILTER (WHERE status <> 'completed'),
    sum({PROMPT}), sum(cache_read_tokens), sum(output_tokens),
    count(predicted_cached_tokens), coalesce(sum(predicted_cached_tokens), 0),
    coalesce(sum(cache_read_tokens) FILTER (WHERE predicted_cached_tokens IS NOT NULL), 0),
    count(ceiling_cached_tokens),
    coalesce(sum({PROMPT}) FILTER (WHERE {HAS_CEILING}), 0),
    coalesce(sum(cache_read_tokens) FILTER (WHERE {HAS_CEILING}), 0),
    coalesce(sum(ceiling_cached_tokens), 0),
    count(*) FILTER (WHERE {HAS_CEILING} AND ceiling_exact),
    count(cache_read_host_tokens),
    coalesce(sum(cache_read_tokens) FILTER (WHERE cache_read_host_tokens IS NOT NULL), 0),
    coalesce(sum(cache_read_host_tokens), 0), coalesce(sum(cache_read_disk_tokens), 0)
FROM requests GROUP BY {HOUR}, model, upstream
"""

TTFT_HOURS = f"""
INSERT INTO ttft_hours (hour, tenant_id, model, warm, bucket, requests)
SELECT {HOUR}, tenant_id, model, cache_read_tokens > 0, {BUCKET}, count(*)
FROM requests WHERE first_token_at IS NOT NULL
GROUP BY {HOUR}, tenant_id, model, cache_read_tokens > 0, {BUCKET}
"""

BREAK_HOURS = f"""
INSERT INTO break_hours (
    hour, tenant_id, model, price_id, rate_class, break_tokens, early,
    requests, lost_tokens, prompt_tokens)
SELECT {HOUR}, tenant_id, model, coalesce(price_id, ''), coalesce(rate_class, ''),
    break_tokens, coalesce(break_early, false), count(*), sum(coalesce(lost_tokens, 0)),
    sum({PROMPT})
FROM requests WHERE break_tokens IS NOT NULL
GROUP BY {HOUR}, tenant_id, model, coalesce(price_id, ''), coalesce(rate_class, ''),
    break_tokens, coalesce(break_early, false)
"""

ROLLUPS = {
    "interactions": (CELLS, INTERACTIONS),
    "interaction_cells": (INTERACTION_CELLS,),
    "usage_hours": (USAGE_HOURS,),
    "replica_hours": (REPLICA_HOURS,),
    "ttft_hours": (TTFT_HOURS,),
    "break_hours": (BREAK_HOURS,),
    # The statement migration 0016 fills it with, from the writer's own module.
    "deployment_hours": (deployments.backfill_sql("postgresql"),),
    # And migration 0019's: the lines, their cells, their counts.
    "statement_lines": lines.backfill_sql("postgresql"),
}
ROLLUP_TABLES = tuple(ROLLUPS)


def connect(url: str) -> psycopg.Connection[Any]:
    """A psycopg connection to ``url`` (any SQLAlchemy spelling of a Postgres URL)."""
    parsed = make_url(url).set(drivername="postgresql")
    return psycopg.connect(parsed.render_as_string(hide_password=False))


def copy_records(url: str, records: Iterable[Record]) -> int:
    """COPY the records' rows (``record_row``, what the recorder writes) into ``requests``,
    its secondary indexes dropped during the copy and made again after; how many."""
    copied = 0
    with connect(url) as connection, connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'requests'"
            " AND indexname <> 'requests_pkey'"
        )
        indexes = cursor.fetchall()
        for name, _definition in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        names: list[str] | None = None
        iterator = iter(records)
        first = next(iterator, None)
        if first is not None:
            row = record_row(first)
            names = list(row)
            columns = ", ".join(f'"{name}"' for name in names)
            with cursor.copy(f"COPY requests ({columns}) FROM STDIN") as copy:
                copy.write_row(_values(row, names))
                copied = 1
                for record in iterator:
                    copy.write_row(_values(record_row(record), names))
                    copied += 1
        for _name, definition in indexes:
            cursor.execute(definition)
    return copied


def _values(row: dict[str, Any], names: list[str]) -> list[Any]:
    values = [row[name] for name in names]
    if row.get("tags") is not None:
        values[names.index("tags")] = psycopg.types.json.Json(row["tags"])
    return values


def build_rollups(url: str) -> dict[str, float]:
    """Build every rollup from the requests table in one transaction (the rollup tables
    empty before); seconds each took."""
    seconds: dict[str, float] = {}
    with connect(url) as connection, connection.cursor() as cursor:
        for table, statements in ROLLUPS.items():
            began = time.perf_counter()
            for statement in statements:
                cursor.execute(statement)  # type: ignore[arg-type]
            seconds[table] = time.perf_counter() - began
    return seconds
