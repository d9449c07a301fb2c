"""Hourly rollups: exact sums of the requests, untouched by replays, rebuilt by migration."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import (
    Engine,
    MetaData,
    Table,
    create_engine,
    func,
    insert,
    inspect,
    select,
    text,
)

from gateway.accounting.store import insert_records, record_row
from gateway.db import statements
from gateway.db.figures import spend
from gateway.db.figures.spend import Scope
from gateway.db.migrate import downgrade, upgrade
from gateway.db.models import (
    InteractionCellRow,
    InteractionRow,
    ReplicaHourRow,
    RequestRow,
    TtftHourRow,
    UsageHourRow,
)
from gateway.db.session import make_engine, normalise_url
from gateway.db.writer import rollups
from tests.dashboard.conftest import World, at, world_records

ROLLUPS = (UsageHourRow, ReplicaHourRow, TtftHourRow, InteractionCellRow, InteractionRow)
EVERYTHING = Scope(datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))


def snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every rollup row, sorted: two databases with equal snapshots hold equal rollups."""
    with engine.connect() as connection:
        return {
            model.__tablename__: sorted(
                tuple(row) for row in connection.execute(select(model.__table__))
            )
            for model in ROLLUPS
        }


def test_rollup_sums_equal_the_requests_sums(world: World) -> None:
    columns = [*rollups.TOKEN_COLUMNS, *rollups.COST_COLUMNS]
    with world.sessions() as session:
        raw = session.execute(
            select(func.count(), *[func.sum(getattr(RequestRow, c)) for c in columns])
        ).one()
        rolled = session.execute(
            select(
                func.sum(UsageHourRow.requests),
                *[func.sum(getattr(UsageHourRow, c)) for c in columns],
            )
        ).one()
    assert tuple(rolled) == tuple(raw)
    assert rolled[-2] == sum((r.cost.total for r in world.records), Decimal(0))


def test_a_replayed_batch_adds_only_its_new_records(world: World) -> None:
    engine = make_engine(world.url)
    before = snapshot(engine)
    insert_records(engine, world.records)  # a whole replay: nothing new
    assert snapshot(engine) == before
    extra = replace(
        world.records[0],
        request_id="req_new",
        interaction_id="i1",
        started_at=at(30, 10, 40),
        ended_at=at(30, 10, 41),
    )
    insert_records(engine, [*world.records[:3], extra, extra])
    insert_records(engine, [extra])
    with engine.connect() as connection:
        hour = connection.execute(
            select(
                UsageHourRow.requests, UsageHourRow.cost_total, UsageHourRow.completed_cells
            ).where(UsageHourRow.hour == at(30, 10), UsageHourRow.tenant_id == world.a)
        ).one()
    first, second = world.records[0], world.records[1]
    # i1 already completed in this hour: the new attempt adds cost but no interaction cell.
    assert tuple(hour) == (3, first.cost.total * 2 + second.cost.total, 2)
    engine.dispose()


def test_completed_interactions_equal_billings_for_every_period(world: World) -> None:
    """The conversation completes at 00:00 and 06:00 on July 1: counted once per period."""
    days = [date(2026, 6, 30), date(2026, 7, 1)]
    with world.sessions() as session:
        for start, end in [(days[0], days[0]), (days[1], days[1]), (days[0], days[1])]:
            lower, upper = statements.day_bounds(start, end)
            figures = spend.by_tenant(session, Scope(lower, upper))
            for tenant in (world.a, world.b):
                expected = statements.period_completed_interactions(
                    session, tenant_id=tenant, lower=lower, upper=upper
                )
                got = figures[tenant].completed_interactions if tenant in figures else 0
                assert got == expected, (start, end, tenant)
        everyone = spend.totals(session, Scope(*statements.day_bounds(days[0], days[1])))
        only_m = spend.totals(session, replace(EVERYTHING, models=("m",)))
    assert everyone.completed_interactions == len(
        {(r.tenant_id, r.interaction_id) for r in world.records if r.status == "completed"}
    )
    assert only_m.completed_interactions == 4  # i1, i2, conv (a) and i6 (b); i5 is unpriced


def test_daily_buckets_count_an_interaction_in_each_day_it_completed(world: World) -> None:
    engine = make_engine(world.url)
    later = replace(
        world.records[1],
        request_id="req_turn",
        started_at=at(1, 9),
        ended_at=at(1, 9, 1),
        interaction_id="i2",
    )
    insert_records(engine, [later])
    edges = [
        datetime(2026, 6, 30, tzinfo=UTC),
        datetime(2026, 7, 1, tzinfo=UTC),
        datetime(2026, 7, 2, tzinfo=UTC),
    ]
    with world.sessions() as session:
        days = spend.trend(session, replace(EVERYTHING, tenant_ids=(world.a,)), edges)
        both = spend.totals(session, Scope(edges[0], edges[2], (world.a,)))
    assert [f.completed_interactions for _, f in days] == [2, 3]  # i1 i2 | conv i5 i2
    assert both.completed_interactions == 4
    engine.dispose()


def test_migrating_a_database_with_requests_builds_the_same_rollups(
    empty_database_url: str,
) -> None:
    """0001 with requests in it, upgraded: the backfill equals what the recorder builds."""
    records = world_records("ten_a", "ten_b")
    upgrade(empty_database_url, "0001")
    old = create_engine(normalise_url(empty_database_url))
    with old.begin() as connection:
        # The requests table as 0001 made it: later migrations add columns.
        present = {c["name"] for c in inspect(connection).get_columns("requests")}
        table = Table(
            "requests",
            MetaData(),
            *[c._copy() for c in RequestRow.__table__.columns if c.name in present],
        )
        connection.execute(
            insert(table),
            [{k: v for k, v in record_row(r).items() if k in present} for r in records],
        )
    old.dispose()
    upgrade(empty_database_url)
    engine = make_engine(empty_database_url)
    migrated = snapshot(engine)
    assert len(migrated["usage_hours"]) == 6
    with engine.begin() as connection:
        for model in (*ROLLUPS, RequestRow):
            connection.execute(model.__table__.delete())
    insert_records(engine, records)
    assert snapshot(engine) == migrated
    engine.dispose()
    downgrade(empty_database_url, "0001")
    check = create_engine(normalise_url(empty_database_url))
    with check.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM requests")).scalar() == 7
    check.dispose()


@pytest.mark.parametrize(
    ("millis", "bucket", "upper"),
    [
        (1, 0, 2 ** (1 / 8)),
        (100, 53, 2 ** (54 / 8)),  # 2**(53/8) = 98.7 <= 100 < 107.6
        (400, 69, 2 ** (70 / 8)),  # 395.0 <= 400 < 430.5
        (2000, 87, 2 ** (88 / 8)),  # 1,910.6 <= 2,000 < 2,048
    ],
)
def test_ttft_buckets_are_eight_per_doubling(millis: int, bucket: int, upper: float) -> None:
    assert rollups.ttft_bucket(timedelta(milliseconds=millis)) == bucket
    assert rollups.bucket_upper_ms(bucket) == upper
    assert rollups.ttft_bucket(timedelta(0)) == rollups.LOWEST_BUCKET
