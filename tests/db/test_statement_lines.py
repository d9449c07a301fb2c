"""``statement_lines`` and ``statement_cells`` (migration 0019).

- What the writer folds in batch by batch equals what the migration's backfill and a
  rebuild of every rollup make of the same stored requests, on both databases.
- A line counts each interaction its completed attempts completed once, across batches,
  replays and concurrent writers.
- The statement built from the lines is the statement built from the requests, byte for
  byte."""

from __future__ import annotations

import threading
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import select, text

from gateway import billing
from gateway.accounting.records import Record, Status
from gateway.accounting.store import insert_records
from gateway.db import statements
from gateway.db.models import LINE_KEYS, StatementLineRow, TenantRow
from gateway.db.session import make_engine, session_factory
from gateway.db.writer import lines, rollups
from gateway.usage import Usage, UsageSource
from tests.factories import STARTED, record

LINES = StatementLineRow.__table__
ESTIMATED, REPORTED = UsageSource.ESTIMATED, UsageSource.REPORTED
KEYED_CELLS = text(
    f"SELECT {', '.join(f'l.{k}' for k in LINE_KEYS)}, c.interaction_id"
    " FROM statement_cells c JOIN statement_lines l ON l.id = c.line_id"
)


def varied() -> list[Record]:
    """Attempts over three days, two tenants and two models: interactions completed by
    several attempts of one line (in two batches), completed on two days, failed and then
    retried, unpriced; endpoints not kept; estimated usage."""
    found = []
    for n in range(40):
        failed = n % 6 == 0
        found.append(
            record(
                f"req_{n:03}",
                tenant_id=("ten_a", "ten_b")[n % 2],
                interaction_id=f"int_{n % 13}",
                model=("m", "m2")[n % 5 % 2],
                usage=Usage(100 + n, 16 * n, n % 3, n, source=ESTIMATED if failed else REPORTED),
                started_at=STARTED + timedelta(hours=5 * n),
                endpoint=("/v1/chat/completions", "/v1/responses", None)[n % 3],
                status=Status.FAILED if failed else Status.COMPLETED,
                **({"prices": None} if n % 7 == 0 else {}),
            )
        )
    return found


def keyed(connection: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The lines without their ids, and the cells by their lines' keys."""
    names = [c for c in LINES.c if c.name != "id"]
    rows = sorted(tuple(row) for row in connection.execute(select(*names)))
    cells = sorted(tuple(row) for row in connection.execute(KEYED_CELLS))
    return rows, cells


def test_the_backfill_equals_what_the_writer_made(database_url: str) -> None:
    records = varied()
    engine = make_engine(database_url)
    insert_records(engine, records[:15])
    insert_records(engine, records[15:])  # lines and cells added to in a later batch
    with engine.begin() as connection:
        written = keyed(connection)
        connection.execute(text("DELETE FROM statement_cells"))
        connection.execute(text("DELETE FROM statement_lines"))
        lines.backfill(connection)
        filled = keyed(connection)
        rollups.rebuild(connection, batch_size=7)  # every rollup again, the writer's way
        rebuilt = keyed(connection)
    engine.dispose()
    assert filled == written and rebuilt == written
    rows, cells = written
    assert len(rows) > 20 and len(cells) > 20
    index = {c.name: n - 1 for n, c in enumerate(LINES.c)}
    assert sum(row[index["requests"]] for row in rows) == 40
    assert sum((row[index["cost_total"]] for row in rows), Decimal(0)) == sum(
        (r.cost.total for r in records), Decimal(0)
    )
    assert {row[index["endpoint"]] for row in rows} >= {"", "/v1/responses"}
    assert {row[index["price_id"]] for row in rows} >= {""}


def test_a_line_counts_an_interaction_once(database_url: str) -> None:
    """Three completed attempts of one interaction in one line (two batches, one replayed),
    one of another, a failed one of a third: two completed interactions, five attempts."""
    at = STARTED.replace(hour=1)

    def attempt(n: int, interaction: str, status: Status = Status.COMPLETED) -> Record:
        return record(
            f"req_{n}",
            interaction_id=interaction,
            usage=Usage(1000, 200, 0, 50),
            started_at=at + timedelta(hours=n),
            endpoint="/v1/chat/completions",
            status=status,
        )

    first = [attempt(0, "int_x"), attempt(1, "int_x"), attempt(2, "int_y")]
    second = [attempt(3, "int_x"), attempt(4, "int_z", Status.FAILED)]
    engine = make_engine(database_url)
    insert_records(engine, first)
    insert_records(engine, second)
    insert_records(engine, first + second)  # replayed from the journal: nothing changes
    with engine.connect() as connection:
        row = connection.execute(select(LINES)).mappings().one()
        cells = connection.execute(text("SELECT count(*) FROM statement_cells")).scalar()
    engine.dispose()
    attempts = first + second
    assert (row["day"], row["requests"], row["completed_interactions"], cells) == (
        STARTED.date(),
        5,
        2,
        2,
    )
    assert row["uncached_tokens"] == 5 * 1000 and row["cache_read_tokens"] == 5 * 200
    assert row["cost_total"] == sum((r.cost.total for r in attempts), Decimal(0))
    assert row["cost_total"] > 0


def test_concurrent_writers_count_an_interaction_once(database_url: str) -> None:
    """Eight writers at once, each with a completed attempt of one interaction in one line:
    the line has eight attempts and one completed interaction."""
    engine = make_engine(database_url)
    ready = threading.Barrier(8)
    failures: list[BaseException] = []

    def write(n: int) -> None:
        try:
            ready.wait()
            insert_records(
                engine,
                [record(f"req_{n}", interaction_id="int_shared", started_at=STARTED)],
            )
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with engine.connect() as connection:
        row = connection.execute(select(LINES.c.requests, LINES.c.completed_interactions)).one()
    engine.dispose()
    assert not failures
    assert tuple(row) == (8, 1)


def test_the_statement_from_the_lines_is_the_statement_from_the_requests(
    database_url: str,
) -> None:
    records = varied()
    engine = make_engine(database_url)
    insert_records(engine, records)
    start, end = STARTED.date() - timedelta(days=1), STARTED.date() + timedelta(days=9)
    with session_factory(engine)() as session:
        for tenant_id in ("ten_a", "ten_b"):
            tenant = TenantRow(id=tenant_id, name=tenant_id)
            built = billing.build_statement(session, tenant=tenant, start=start, end=end)
            raw = statements.statement_lines(session, tenant_id=tenant_id, start=start, end=end)
            lower, upper = statements.day_bounds(start, end)
            counted = statements.period_completed(
                session, tenant_id=tenant_id, lower=lower, upper=upper
            )
            assert built.lines == raw and built.totals.completed == counted
            assert len(raw) > 8 and counted.interactions > 3
            from_requests = billing.Statement(
                **{
                    **{f: getattr(built, f) for f in billing.Statement.__dataclass_fields__},
                    "lines": raw,
                    "totals": billing.Totals(
                        **{
                            **{
                                f: getattr(built.totals, f)
                                for f in billing.Totals.__dataclass_fields__
                            },
                            "completed": counted,
                        }
                    ),
                }
            )
            for fmt in ("json", "csv"):
                assert billing.render(built, fmt) == billing.render(from_requests, fmt)
        # A day with no request has no line; a period of none, no lines at all.
        empty = statements.rolled_lines(
            session, tenant_id="ten_a", start=date(2020, 1, 1), end=date(2020, 1, 31)
        )
    engine.dispose()
    assert empty == []
