"""``deployment_hours``: what the writer folds in record by record, migration 0016's one
grouped statement makes of the same stored requests, row for row, on both databases."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from sqlalchemy import select, text

from gateway.accounting.records import Status
from gateway.accounting.store import insert_records
from gateway.db.models import DeploymentHourRow
from gateway.db.session import make_engine
from gateway.db.writer import deployments
from gateway.usage import Usage
from tests.factories import STARTED, record


def test_the_backfill_equals_what_the_writer_made(database_url: str) -> None:
    records = [
        record(f"req_{n}", tenant_id=("ten_a", "ten_b")[n % 2], usage=Usage(100 + n, 16 * n, 0, n),
               started_at=STARTED + timedelta(minutes=17 * n), deployment=("d1", "d2")[n % 3 % 2],
               endpoint=("/v1/chat/completions", "/v1/embeddings", None)[n % 3],
               status=Status.FAILED if n % 5 == 0 else Status.COMPLETED,
               **({"price_id": None} if n % 4 == 0 else {}))
        for n in range(24)
    ]  # fmt: skip
    engine = make_engine(database_url)
    insert_records(engine, records[:10])
    insert_records(engine, records[10:])  # hours added to in a later batch
    table = DeploymentHourRow.__table__
    with engine.begin() as connection:
        written = sorted(tuple(row) for row in connection.execute(select(table)))
        connection.execute(table.delete())
        deployments.backfill(connection)
        filled = sorted(tuple(row) for row in connection.execute(select(table)))
        unknown = connection.execute(
            text("SELECT sum(requests) FROM deployment_hours WHERE endpoint = ''")
        ).scalar()
    engine.dispose()
    assert filled == written
    assert len(written) > 12 and unknown == 8
    requests, cost = table.c.keys().index("requests"), table.c.keys().index("cost_total")
    assert sum(row[requests] for row in written) == 24
    assert sum((row[cost] for row in written), Decimal(0)) == sum(
        (r.cost.total for r in records), Decimal(0)
    )
