"""Routing efficiency compares like with like and never exceeds 100 %; the ceiling's kind is kept.

A router's ceiling can fall short of what its replica then served (text mode's character
blocks, cached output blocks, traffic it did not see): the row keeps the larger, so the
achieved cached tokens of any set of rows are at most their ceilings.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import MetaData, Table, create_engine, insert, inspect, select
from sqlalchemy.orm import Session

from gateway.accounting.records import Record, Status
from gateway.accounting.store import insert_records, record_row
from gateway.db.figures import replicas, spend
from gateway.db.figures.spend import Scope
from gateway.db.migrate import upgrade
from gateway.db.models import ReplicaHourRow, RequestRow, UsageHourRow
from gateway.db.session import make_engine, normalise_url
from gateway.db.writer import rollups
from gateway.usage import Usage
from pricing.cost import Cost

START = datetime(2026, 11, 2, 9, tzinfo=UTC)
DAY = Scope(START.replace(hour=0), START.replace(hour=0) + timedelta(days=1))


def routed(
    n: int,
    cached: int,
    ceiling: int | None,
    *,
    exact: bool | None,
    uncached: int = 100,
    tenant: str = "t",
    model: str = "m",
) -> Record:
    return Record(
        request_id=f"r{n}",
        tenant_id=tenant,
        api_key_id="k",
        interaction_id=f"i{n}",
        model=model,
        deployment=model,
        upstream=f"http://r{n % 2}",
        started_at=START + timedelta(minutes=n),
        ended_at=START + timedelta(minutes=n, seconds=1),
        status=Status.COMPLETED,
        usage=Usage(uncached, cached, 0, 1),
        cost=Cost(),
        predicted_cached_tokens=None if ceiling is None else cached,
        ceiling_cached_tokens=ceiling,
        ceiling_exact=exact,
    )


# A text-mode router: its ceilings (estimated tokens) are below two of the replicas' hits:
# 512 + 16 + 32 = 560 estimated against 528 + 48 + 0 = 576 reported (102.86 %); one request
# carries no ceiling. Upstreams alternate: r1 and r3 on http://r1, r2 and r4 on http://r0.
APPROXIMATE = [
    routed(1, 528, 512, exact=False),
    routed(2, 48, 16, exact=False),
    routed(3, 0, 32, exact=False),
    routed(4, 32, None, exact=None),
]


def test_a_stored_ceiling_is_at_least_the_reported_cached_tokens(database_url: str) -> None:
    engine = make_engine(database_url)
    insert_records(engine, APPROXIMATE)
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                RequestRow.cache_read_tokens,
                RequestRow.ceiling_cached_tokens,
                RequestRow.ceiling_exact,
            ).order_by(RequestRow.request_id)
        ).all()
        usage = connection.execute(
            select(
                UsageHourRow.ceiling_requests,
                UsageHourRow.ceiling_cache_read_tokens,
                UsageHourRow.ceiling_cached_tokens,
                UsageHourRow.exact_ceiling_requests,
                UsageHourRow.avoidable_miss_tokens,
            )
        ).one()
    engine.dispose()
    assert [tuple(r) for r in rows] == [
        (528, 528, False),
        (48, 48, False),
        (0, 32, False),
        (32, None, None),
    ]
    assert tuple(usage) == (3, 576, 608, 0, 32)


def test_efficiency_is_at_most_100_percent_in_every_figure(database_url: str) -> None:
    """With the router's ceilings it was 576 / 560 (and 48 / 16 on one replica); stored,
    efficiency is over the same requests and tokens of the same kind everywhere."""
    engine = make_engine(database_url)
    insert_records(engine, APPROXIMATE)
    with Session(engine) as session:
        totals = spend.totals(session, DAY)
        per_tenant = spend.by_tenant(session, DAY)["t"]
        (row,) = spend.achieved_vs_ceiling(session, DAY)
        per_replica = {r.upstream: r.figures for r in replicas.by_replica(session, DAY)}
        trend = replicas.routing_trend(session, DAY, [DAY.lower, DAY.upper])
    engine.dispose()
    assert totals.routing_efficiency == Decimal(576) / 608
    assert per_tenant.routing_efficiency == row.figures.routing_efficiency == Decimal(576) / 608
    assert totals.ceiling_rate == Decimal(608) / 876  # prompt tokens of r1, r2 and r3
    assert totals.ceiling_kind == row.figures.ceiling_kind == "approximate"
    assert per_replica["http://r1"].routing_efficiency == Decimal(528) / 560
    assert per_replica["http://r0"].routing_efficiency == 1
    assert per_replica["http://r0"].ceiling_kind == "approximate"
    assert trend[0][1].routing_efficiency == Decimal(576) / 608


def test_ceiling_kind_counts_exact_and_approximate_requests(database_url: str) -> None:
    engine = make_engine(database_url)
    exact = [routed(10 + n, 16 * n, 32 * n, exact=True, tenant="e") for n in range(3)]
    mixed = [routed(20, 16, 32, exact=True, tenant="x"), routed(21, 0, 16, exact=False, tenant="x")]
    insert_records(engine, [*exact, *mixed])
    with Session(engine) as session:
        figures = spend.by_tenant(session, DAY)
        per_replica = replicas.by_replica(session, DAY)
    assert (figures["e"].ceiling_requests, figures["e"].exact_ceiling_requests) == (3, 3)
    assert figures["e"].ceiling_kind == "exact"
    assert (figures["x"].ceiling_requests, figures["x"].exact_ceiling_requests) == (2, 1)
    assert figures["x"].ceiling_kind == "partly approximate"
    assert sum(r.figures.exact_ceiling_requests for r in per_replica) == 4
    assert spend.Figures().ceiling_kind is None
    engine.dispose()


def test_migration_raises_old_ceilings_and_rebuilds_the_rollups(empty_database_url: str) -> None:
    """A database with rows the old recorder wrote (ceilings below the hits) is upgraded:
    the ceilings become the hits, the rollups equal the recorder's, the kind is unknown."""
    upgrade(empty_database_url, "0004")
    old = create_engine(normalise_url(empty_database_url))
    with old.begin() as connection:
        present = {c["name"] for c in inspect(connection).get_columns("requests")}
        table = Table(
            "requests",
            MetaData(),
            *[c._copy() for c in RequestRow.__table__.columns if c.name in present],
        )
        rows = []
        for record in APPROXIMATE:
            row = {k: v for k, v in record_row(record).items() if k in present}
            row["ceiling_cached_tokens"] = record.ceiling_cached_tokens  # as the old code did
            rows.append(row)
        connection.execute(insert(table), rows)
        # The rollups the old recorder built from those rows, in the tables 0004 has.
        legacy = {
            name: {c["name"] for c in inspect(connection).get_columns(name)}
            for name in ("usage_hours", "replica_hours", "ttft_hours", "interaction_cells")
        }
        rollups.add(connection, [{**row, "ceiling_exact": None} for row in rows], present=legacy)
        before = connection.scalar(select(UsageHourRow.__table__.c.ceiling_cached_tokens))
    old.dispose()
    assert before == 560  # the old rollup: 576 achieved of it, 102.86 %
    upgrade(empty_database_url)
    engine = make_engine(empty_database_url)
    with engine.connect() as connection:
        ceilings = connection.scalars(
            select(RequestRow.ceiling_cached_tokens).order_by(RequestRow.request_id)
        ).all()
        kinds = set(connection.scalars(select(RequestRow.ceiling_exact)))
        usage = connection.execute(
            select(
                UsageHourRow.ceiling_cache_read_tokens,
                UsageHourRow.ceiling_cached_tokens,
                UsageHourRow.exact_ceiling_requests,
            )
        ).one()
        replica_ceiling = connection.scalar(
            select(ReplicaHourRow.ceiling_cached_tokens).where(
                ReplicaHourRow.upstream == "http://r1"
            )
        )
    assert ceilings == [528, 48, 32, None]
    assert kinds == {None}
    assert tuple(usage) == (576, 608, 0)
    assert replica_ceiling == 560
    engine.dispose()
