"""The writer's batch insert stores every value exactly as given, skips rows already there,
adds into rollup rows on conflict, and refuses what its columns refuse, on both databases
(Postgres reads the batch as one JSON document: each value must come back unchanged)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import StatementError

from gateway.accounting.store import insert_records, record_row
from gateway.db.models import RequestRow, UsageHourRow
from gateway.db.session import make_engine
from gateway.db.writer import bulk
from gateway.usage import Usage
from tests.factories import record

REQUESTS = RequestRow.__table__
AWKWARD = [
    "quotes \" and ' and \\ backslashes",
    "lines\nand\ttabs, \u00e9t\u00e9, \u4e2d\u6587, \U0001f600",
    "{not json}",
    "",
]
MONEY = [
    Decimal("0"),
    Decimal("0E-9"),
    Decimal("1E+2"),
    Decimal("0.000000001"),
    Decimal("1234567.123456789"),
    Decimal("0.0000000025"),  # quantized to the nano as Money does (half to even), not up
]


def rows() -> list[dict[str, Any]]:
    """Request rows whose text, money, times, booleans and tags test each conversion."""
    made = []
    for n, (error, money) in enumerate(zip(AWKWARD * 2, MONEY, strict=False)):
        row = record_row(record(f"req_{n}"))
        row |= {
            "error": error,
            "cost_total": money,
            "stream": n % 2 == 0,
            "ceiling_exact": None if n == 3 else n % 2 == 1,
            "tags": None if n == 2 else {"team": error, "n": str(n)},
            "end_user": None,
            # Another zone's moment: stored as the same instant in UTC.
            "started_at": datetime(
                2026, 12, 2, 7, 0, n, 123456, tzinfo=timezone(timedelta(hours=5))
            ),
        }
        made.append(row)
    return made


def test_every_value_comes_back_as_given(database_url: str) -> None:
    engine = make_engine(database_url)
    given = rows()
    with engine.begin() as connection:
        made = bulk.insert_rows(
            connection, REQUESTS, given, conflict=["request_id"], returning=["request_id"]
        )
    assert made == [(row["request_id"],) for row in given]
    with engine.connect() as connection:
        stored = {r.request_id: r for r in connection.execute(select(RequestRow))}
    for row in given:
        back = stored[row["request_id"]]
        assert back.error == row["error"]
        assert back.cost_total == row["cost_total"].quantize(Decimal("1E-9"))
        assert str(back.cost_total) == str(row["cost_total"].quantize(Decimal("1E-9")))
        assert back.stream is row["stream"]
        assert back.ceiling_exact == row["ceiling_exact"]
        assert back.tags == row["tags"]
        assert back.end_user is None
        assert back.started_at == row["started_at"] and back.started_at.utcoffset() == timedelta(0)
        assert back.cost_output == row["cost_output"]
    assert stored["req_5"].cost_total == Decimal("0.000000002")
    engine.dispose()


def test_rows_already_there_are_skipped_and_not_returned(database_url: str) -> None:
    engine = make_engine(database_url)
    first, second = rows()[:3], rows()[2:]
    with engine.begin() as connection:
        bulk.insert_rows(connection, REQUESTS, first, conflict=["request_id"])
        made = bulk.insert_rows(
            connection,
            REQUESTS,
            [{**row, "error": "changed"} for row in second],
            conflict=["request_id"],
            returning=["request_id"],
        )
    assert made == [(row["request_id"],) for row in second[1:]]
    with engine.connect() as connection:
        errors = dict(connection.execute(select(RequestRow.request_id, RequestRow.error)).all())
    assert errors["req_2"] == AWKWARD[2]  # left as it was
    assert errors["req_3"] == "changed"
    engine.dispose()


def test_a_conflict_adds_into_a_rollup_row(database_url: str) -> None:
    engine = make_engine(database_url)
    table = UsageHourRow.__table__
    keys = {"hour": datetime(2026, 12, 2, 7, tzinfo=UTC), "tenant_id": "ten_1", "model": "m"}
    keys |= {"price_id": "p", "status": "completed"}
    summed = [c.name for c in table.c if c.name not in keys]
    row = keys | {
        name: Decimal("0.000000007") if name.startswith("cost_") else 3 for name in summed
    }
    with engine.begin() as connection:
        for _ in range(3):
            bulk.insert_rows(connection, table, [row], conflict=list(keys), add=summed)
    with engine.connect() as connection:
        (stored,) = connection.execute(select(table)).mappings().all()
    assert stored["requests"] == 9 and stored["output_tokens"] == 9
    assert stored["cost_total"] == stored["cost_output"] == Decimal("0.000000021")
    engine.dispose()


def test_a_naive_moment_is_refused(database_url: str) -> None:
    engine = make_engine(database_url)
    row = rows()[0] | {"started_at": datetime(2026, 12, 2, 7)}
    refused = pytest.raises((ValueError, StatementError), match="naive datetime")
    with refused, engine.begin() as connection:
        bulk.insert_rows(connection, REQUESTS, [row], conflict=["request_id"])
    engine.dispose()


def test_free_text_and_counts_no_column_held_are_written_as_near_as_they_can_be(
    database_url: str,
) -> None:
    """A record whose upstream said a NUL (Postgres refuses one in text, so the row) and a
    finish reason and service tier longer than their columns, with 3,000,000,000 prompt
    tokens (past Postgres's integer), is written: the text fitted, the counts exact."""
    said = record(
        "req_free",
        usage=Usage(3_000_000_000, 0, 0, 2_500_000_000),
        service_tier="t" * 40,
        finish_reason="a\x00" + "b" * 60,
        error="upstream said \x00",
        break_context="before \x00 after",
    )
    engine = make_engine(database_url)
    insert_records(engine, [said])
    with engine.connect() as connection:
        (row,) = connection.execute(select(RequestRow))
    assert (row.uncached_tokens, row.output_tokens) == (3_000_000_000, 2_500_000_000)
    assert row.finish_reason == "a\ufffd" + "b" * 47 + "\u2026"
    assert row.service_tier == "t" * 31 + "\u2026"
    assert (row.error, row.break_context) == ("upstream said \ufffd", "before \ufffd after")
    assert row.cost_total == said.cost.total
