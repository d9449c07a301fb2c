"""The dashboard benchmark's fast load (COPY, then rollups built in SQL) gives the same
requests and every rollup row for row as the recorder's own write path, so its figures at
10,000,000 records are about the data the product builds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from benchmarks import dashboard as bench
from benchmarks import dashboard_load
from gateway.accounting.records import Record, Status
from gateway.accounting.store import insert_records
from gateway.db.models import LINE_KEYS, StatementLineRow
from gateway.db.session import make_engine
from gateway.usage import Usage
from tests.conftest import new_database

pytestmark = pytest.mark.postgres
RECORDS = 5_000
BATCH = 500  # several batches: cells completed again, and spanning, in later batches
TABLES = ("requests", *dashboard_load.ROLLUP_TABLES, "statement_cells")


def varied(record: Record, n: int) -> Record:
    """Give some of the workload's records what it lacks: prefix breaks, tier reports,
    exact ceilings, 1-hour cache writes, tags, and TTFTs on bucket edges."""
    changes: dict[str, object] = {}
    if n % 7 == 0:
        changes |= {
            "break_tokens": 16 * (n % 5),
            "lost_tokens": None if n % 3 == 0 else n % 900,
            "break_early": None if n % 4 == 0 else n % 2 == 0,
            "rate_class": None if n % 2 else "standard",
        }
    if n % 5 == 0 and record.usage.cache_read_tokens:
        host = record.usage.cache_read_tokens // 2
        changes |= {"cache_read_host_tokens": host, "cache_read_disk_tokens": n % 3 or None}
    if record.ceiling_cached_tokens is not None:
        changes["ceiling_exact"] = None if n % 3 == 0 else n % 3 == 1
    if n % 11 == 0:
        usage = record.usage
        changes["usage"] = dataclasses.replace(
            usage, cache_write_tokens=40, cache_write_1h_tokens=n % 41
        )
        changes["tags"] = {"team": f"t{n % 3}"}
    if record.first_token_at is not None and n % 13 == 0:
        # Exactly 1024 ms (a bucket's lower edge), and no time at all (the lowest bucket).
        edge = timedelta(milliseconds=1024) if n % 2 else timedelta(0)
        changes["first_token_at"] = record.started_at + edge
    return dataclasses.replace(record, **changes) if changes else record


def priced_late(last: Record) -> list[Record]:
    """One interaction completed in one hour by an unpriced attempt, then by attempts of
    two price entries: the cell counts as completed on the first one's usage row and as
    priced on the second one's."""
    base = dataclasses.replace(
        last,
        interaction_id="int_priced_late",
        status=Status.COMPLETED,
        usage=Usage(100, 0, 0, 10),
        started_at=bench.END - timedelta(minutes=30),
        first_token_at=bench.END - timedelta(minutes=30) + timedelta(seconds=1),
    )
    entries = (None, "kvgate/test@2026-01-01", "kvgate/test@2026-10-31")
    return [
        dataclasses.replace(
            base,
            request_id=f"req_9000000{n}",
            price_id=entry,
            started_at=base.started_at + timedelta(seconds=5 * n),
        )
        for n, entry in enumerate(entries)
    ]


# Statement lines are numbered in the order they were first written, which differs between
# the loads: compared by their keys, and their cells by their lines' keys.
BY_KEY = {
    "statement_lines": "SELECT "
    + ", ".join(c.name for c in StatementLineRow.__table__.c if c.name != "id")
    + " FROM statement_lines",
    "statement_cells": (
        f"SELECT {', '.join(f'l.{k}' for k in LINE_KEYS)}, c.interaction_id"
        " FROM statement_cells c JOIN statement_lines l ON l.id = c.line_id"
    ),
}


def rows(url: str, table: str) -> list[tuple[object, ...]]:
    engine = make_engine(url)
    with engine.connect() as connection:
        result = connection.execute(text(BY_KEY.get(table, f"SELECT * FROM {table}")))
        found = sorted((tuple(row) for row in result), key=repr)
    engine.dispose()
    return found


def test_copy_and_sql_rollups_equal_the_recorder_row_for_row(
    tmp_path: Path, migrated: Callable[[str], str]
) -> None:
    records = [varied(r, n) for n, r in enumerate(bench.workload(RECORDS))]
    records += priced_late(records[-1])
    template = migrated("postgres")
    with (
        new_database("postgres", tmp_path, template=template) as recorded,
        new_database("postgres", tmp_path, template=template) as loaded,
    ):
        engine = make_engine(recorded)
        for start in range(0, len(records), BATCH):
            insert_records(engine, records[start : start + BATCH])
        engine.dispose()
        assert dashboard_load.copy_records(loaded, records) == len(records)
        dashboard_load.build_rollups(loaded)
        for table in TABLES:
            expected = rows(recorded, table)
            assert expected, f"{table} is empty: the records do not exercise it"
            assert rows(loaded, table) == expected, table
