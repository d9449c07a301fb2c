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

from gateway.accounting.records import Record, Status
from gateway.accounting.store import insert_records, record_row
from gateway.db import crud, statements, sums
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
from gateway.db.session import make_engine, normalise_url, session_factory, transaction
from gateway.db.writer import rollups
from gateway.usage import Usage
from pricing.book import PriceBook, price_from_mapping
from pricing.cost import NANO, Cost, compute
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
    columns = [*sums.TOKENS, *sums.COSTS]
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
                expected = statements.period_completed(
                    session, tenant_id=tenant, lower=lower, upper=upper
                )
                got = figures.get(tenant, spend.Figures())
                assert (got.completed_interactions, got.priced_completed_interactions) == (
                    expected.interactions,
                    expected.priced,
                ), (start, end, tenant)
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


LATE = price_from_mapping(
    {
        "model": "late",
        "effective_from": "2026-08-01T10:30:00Z",
        "input": "1",
        "cache_read": "0.1",
        "cache_write": "1.25",
        "cache_write_1h": "2",
        "output": "2",
    }
)


def late_batches(tenant: str) -> list[list[Record]]:
    """Interactions whose completing attempts are priced, unpriced or both, in batches.

    x completes unpriced at 10:10 (before the price), then priced at 10:50: the same cell,
    a later batch. y fails priced and completes on a model without a price. z completes
    priced in two hours. w completes unpriced only.
    """
    book = PriceBook([LATE])

    def attempt(name: str, minute: int, model: str = "late", failed: bool = False) -> Record:
        started = datetime(2026, 8, 1, 10, tzinfo=UTC) + timedelta(minutes=minute)
        usage = Usage(100 + minute, 10, 20, 5, cache_write_1h_tokens=minute % 20)
        price = book.price_for(model, at=started)
        return Record(
            request_id=f"{name}@{minute}",
            tenant_id=tenant,
            api_key_id="key",
            interaction_id=name,
            model=model,
            deployment=model,
            upstream="provider/late",
            started_at=started,
            ended_at=started + timedelta(seconds=1),
            status=Status.FAILED if failed else Status.COMPLETED,
            usage=usage,
            price_id=price.id if price else None,
            cost=compute(usage, price) if price else Cost(),
        )

    return [
        [attempt("x", 10), attempt("w", 12)],
        [attempt("x", 50), attempt("y", 40, failed=True), attempt("y", 41, model="none")],
        [attempt("z", 45), attempt("z", 65)],
    ]


def test_priced_completed_interactions_equal_billings_however_batches_fall(
    database_url: str,
) -> None:
    """Figures from the rollups count the interactions a priced attempt completed exactly
    as statements do (x, z: 2 of 4), per period and per hour, and a rebuild agrees."""
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    with transaction(sessions) as session:
        crud.add_prices(session, prices=[LATE])
        tenant = crud.create_tenant(session, name="late").id
    batches = late_batches(tenant)
    for batch in batches:
        insert_records(engine, batch)
    records = [r for batch in batches for r in batch]
    day = Scope(datetime(2026, 8, 1, tzinfo=UTC), datetime(2026, 8, 2, tzinfo=UTC))
    edges = [datetime(2026, 8, 1, hour, tzinfo=UTC) for hour in (10, 11, 12)]
    with sessions() as session:
        figures = spend.totals(session, day)
        billed = statements.period_completed(
            session, tenant_id=tenant, lower=day.lower, upper=day.upper
        )
        hours = [
            (f.completed_interactions, f.priced_completed_interactions)
            for _, f in spend.trend(session, day, edges)
        ]
    assert (billed.interactions, billed.priced) == (4, 2)
    assert (figures.completed_interactions, figures.priced_completed_interactions) == (4, 2)
    assert hours == [(4, 2), (1, 1)]  # x w y z | z
    priced_cost = sum((r.cost.total for r in records if r.priced), Decimal(0))
    assert figures.sums.cost_total == priced_cost  # y's failed priced attempt included
    assert figures.cost_per_completed_interaction == (priced_cost / 2).quantize(NANO)
    assert figures.unpriced_interaction_share == Decimal("0.5")
    # x@10, w@12 and y@41: 135 + minute tokens each
    assert (figures.unpriced.requests, figures.unpriced.tokens) == (3, 145 + 147 + 176)
    assert figures.sums.cache_write_1h_tokens == sum(r.usage.cache_write_1h_tokens for r in records)
    incremental = snapshot(engine)
    with engine.begin() as connection:
        assert rollups.rebuild(connection) == len(records)
    assert snapshot(engine) == incremental
    engine.dispose()


def test_cells_priced_after_an_unpriced_completion_are_counted_in_every_chunk(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five interactions completed unpriced, then priced in the same hour by a later
    batch: all five become priced, updated two cells at a time."""
    monkeypatch.setattr(rollups, "CELLS_PER_UPDATE", 2)
    engine = make_engine(database_url)
    with transaction(session_factory(engine)) as session:
        crud.add_prices(session, prices=[LATE])
    first, later = late_batches("t")[:2]
    x_unpriced, x_priced = first[0], later[0]
    for when in (x_unpriced, x_priced):
        insert_records(
            engine,
            [
                replace(when, request_id=f"{n}{when.request_id}", interaction_id=f"x{n}")
                for n in range(5)
            ],
        )
    with session_factory(engine)() as session:
        figures = spend.totals(session, EVERYTHING)
    assert (figures.completed_interactions, figures.priced_completed_interactions) == (5, 5)
    engine.dispose()


def test_migrating_to_priced_cells_rebuilds_the_rollups_the_recorder_builds(
    empty_database_url: str,
) -> None:
    """Requests recorded at 0004: after the upgrade, rollups equal the recorder's."""
    records = [r for batch in late_batches("ten") for r in batch]
    upgrade(empty_database_url, "0004")
    old = create_engine(normalise_url(empty_database_url))
    with old.begin() as connection:
        present = {c["name"] for c in inspect(connection).get_columns("requests")}
        columns = [c._copy() for c in RequestRow.__table__.columns if c.name in present]
        rows = [{k: v for k, v in record_row(r).items() if k in present} for r in records]
        connection.execute(insert(Table("requests", MetaData(), *columns)), rows)
    old.dispose()
    upgrade(empty_database_url)
    engine = make_engine(empty_database_url)
    migrated = snapshot(engine)
    assert sum(row[-1] for row in migrated["interaction_cells"]) == 3  # x, z, z priced
    with engine.begin() as connection:
        for model in (*ROLLUPS, RequestRow):
            connection.execute(model.__table__.delete())
    for batch in late_batches("ten"):
        insert_records(engine, batch)
    assert snapshot(engine) == migrated
    engine.dispose()


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
