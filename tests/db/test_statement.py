"""Statements: line items per day × model × price entry; totals are exact sums."""

import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import orjson
import pytest

from gateway import billing
from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.db import crud
from gateway.db.session import make_engine, session_factory, transaction
from gateway.errors import InvalidRequest
from gateway.usage import Usage
from tests.factories import JAN, JUL, price, tenants
from tests.factories import record as make_record

D = Decimal


def record(
    n: int,
    tenant: str,
    started: datetime,
    usage: Usage,
    *,
    status: Status = Status.COMPLETED,
    interaction: str | None = None,
    model: str = "m",
) -> Record:
    return make_record(
        f"req_{tenant}_{n}",
        tenant_id=tenant,
        api_key_id="key",
        usage=usage,
        started_at=started,
        model=model,
        interaction_id=interaction or f"i{n}",
        status=status,
    )


@pytest.fixture
def world(database_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    made = tenants(engine, "a", "b", prices=[JAN, JUL])
    a, b = made["a"].id, made["b"].id
    june30 = datetime(2026, 6, 30, 23, 59, 59, tzinfo=UTC)
    july1 = datetime(2026, 7, 1, 0, 0, 0, tzinfo=UTC)
    records = [
        record(1, a, june30, Usage(1000, 0, 0, 100)),  # JAN prices
        record(2, a, june30, Usage(200, 800, 0, 50)),
        record(3, a, july1, Usage(333, 777, 0, 999), interaction="conv"),  # failed, retried
        record(4, a, july1, Usage(0, 0, 0, 0), status=Status.FAILED, interaction="conv"),
        record(5, a, july1 + timedelta(hours=5), Usage(7, 0, 0, 1), model="unpriced"),
        record(6, b, july1, Usage(10**6, 0, 0, 0)),  # another tenant
    ]
    insert_records(engine, records)
    yield sessions, a, b, records
    engine.dispose()


def test_lines_group_by_day_model_and_price_with_exact_sums(world) -> None:  # type: ignore[no-untyped-def]
    sessions, a, _, records = world
    with sessions() as session:
        tenant = crud.get_tenant(session, name="a")
        statement = billing.build_statement(
            session, tenant=tenant, start=date(2026, 6, 30), end=date(2026, 7, 1)
        )
    lines = [
        (
            item.day,
            item.model,
            item.price_id,
            item.sums.requests,
            item.completed_interactions,
            item.sums.uncached_tokens,
            item.sums.cache_read_tokens,
            item.sums.output_tokens,
            item.sums.cost_total,
        )
        for item in statement.lines
    ]
    assert lines == [
        # 1200 × 0.20 + 800 × 0.02 + 150 × 0.60 (per 1M) = 0.000240 + 0.000016 + 0.000090
        ("2026-06-30", "m", JAN.id, 2, 2, 1200, 800, 150, D("0.000346000")),
        # 333 × 0.15 + 777 × 0.015 + 999 × 0.45 = 0.00004995 + 0.000011655 + 0.00044955
        ("2026-07-01", "m", JUL.id, 2, 1, 333, 777, 999, D("0.000511155")),
        ("2026-07-01", "unpriced", None, 1, 1, 7, 0, 1, D("0E-9")),
    ]
    own = [r for r in records if r.tenant_id == a]
    totals = statement.totals
    assert totals.sums.cost_total == sum((r.cost.total for r in own), D(0))
    assert totals.sums.cost_total == D("0.000857155")
    assert totals.sums.requests == 5
    assert (totals.completed.interactions, totals.completed.priced) == (4, 3)
    # Over the 3 interactions a priced attempt completed (i1, i2, conv), not 4: i5 has no
    # price, so its cost is unknown rather than 0. 0.000857155 / 3 = 0.000285718333…
    assert totals.cost_per_completed_interaction == D("0.000285718")
    assert totals.unpriced_interaction_share == D("0.25")
    assert (totals.unpriced.requests, totals.unpriced.tokens) == (1, 8)
    assert statement.lines[0].rates is not None
    assert statement.lines[0].rates.input == D("0.200000000")
    assert statement.lines[2].rates is None and not statement.lines[2].priced
    assert statement.currency == "USD"


def test_a_statement_holds_nothing_of_another_tenant(world) -> None:  # type: ignore[no-untyped-def]
    sessions, _a, b_id, _records = world
    with sessions() as session:
        tenant = crud.get_tenant(session, name="b")
        statement = billing.build_statement(
            session, tenant=tenant, start=date(2026, 1, 1), end=date(2026, 12, 31)
        )
    assert tenant.id == b_id and statement.tenant_id == b_id
    assert [
        (item.sums.requests, item.sums.uncached_tokens, item.sums.cost_total)
        for item in statement.lines
    ] == [(1, 10**6, D("0.150000000"))]


def test_days_outside_the_period_are_left_out(world) -> None:  # type: ignore[no-untyped-def]
    sessions, *_ = world
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="a"),
            start=date(2026, 7, 1),
            end=date(2026, 7, 1),
        )
    assert {item.day for item in statement.lines} == {"2026-07-01"}
    assert statement.totals.sums.requests == 3


def test_json_money_is_decimal_strings_and_csv_has_a_total_row(world) -> None:  # type: ignore[no-untyped-def]
    sessions, *_ = world
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="a"),
            start=date(2026, 6, 30),
            end=date(2026, 7, 1),
        )
    document = orjson.loads(billing.to_json(statement))
    assert document["totals"]["cost_total"] == "0.000857155"
    assert document["line_items"][0]["cost_total"] == "0.000346000"
    assert document["line_items"][0]["input_rate"] == "0.200000000"
    rows = billing.to_csv(statement).decode().splitlines()
    # The columns a statement always had, in their places; new ones only after them.
    assert rows[0].startswith(
        "day,model,price_id,rate_class,currency,requests,completed_interactions,"
        "uncached_tokens,cache_read_tokens,cache_write_tokens,cache_write_1h_tokens,"
        "output_tokens,input_rate,cache_read_rate,cache_write_rate,cache_write_1h_rate,"
        "output_rate,cost_uncached,cost_cache_read,cost_cache_write,cost_output,cost_total,"
    )
    assert rows[0].split(",")[22:] == [
        "usage_source",
        "priced",
        "cost_uncached_equivalent",
        "cost_per_completed_interaction",
        "priced_completed_interactions",
        "unpriced_completed_interactions",
        "unpriced_interaction_share",
        "unpriced_requests",
        "unpriced_tokens",
        "estimated_requests",
        "estimated_tokens",
        "missing_requests",
        "group",
        "endpoint",
        # A price correction's adjustment rows (db/adjustments.py), then the TOTAL row's
        # totals before and after them.
        "adjustment_id",
        "adjustment_billed",
        "adjustment_corrected",
        "adjustment_delta",
        "adjustment_rates",
        "adjustment_reason",
        "adjustment_by",
        "adjusted_at",
        "correction_key",
        "cost_total_before_adjustments",
        "adjustment_total",
        "cost_total_after_adjustments",
    ]
    assert rows[-1].split(",")[0] == "TOTAL"
    assert rows[-1].split(",")[21] == "0.000857155"


def test_unpriced_lines_say_so_with_no_cost_and_no_currency(world) -> None:  # type: ignore[no-untyped-def]
    """A model without a price: priced false, money and rates null in JSON and empty in
    CSV, no currency; totals count it apart, and cost per completed interaction is over
    the priced interactions with the unpriced share beside it."""
    sessions, *_ = world
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="a"),
            start=date(2026, 6, 30),
            end=date(2026, 7, 1),
        )
    document = orjson.loads(billing.to_json(statement))
    priced, _, unpriced = document["line_items"]
    assert (priced["priced"], priced["currency"], priced["cost_total"]) == (
        True,
        "USD",
        "0.000346000",
    )
    assert {k: unpriced[k] for k in ("model", "priced", "currency", "requests")} == {
        "model": "unpriced",
        "priced": False,
        "currency": None,
        "requests": 1,
    }
    unknown = [*billing.RATES, *billing.CHARGES, "cost_uncached_equivalent"]
    assert {k: unpriced[k] for k in unknown} == dict.fromkeys(unknown)
    assert (unpriced["uncached_tokens"], unpriced["output_tokens"]) == (7, 1)
    assert document["currency"] == "USD"
    totals = document["totals"]
    assert tuple(totals) == billing.TOTAL_COLUMNS
    assert {k: totals[k] for k in billing.TOTAL_COLUMNS[-10:]} == {
        # (2000 × 0.20 + 150 × 0.60) + (1110 × 0.15 + 999 × 0.45) per 1M, priced lines only
        "cost_uncached_equivalent": "0.001106050",
        "priced_completed_interactions": 3,
        "unpriced_completed_interactions": 1,
        "unpriced_interaction_share": "0.250000000",
        "unpriced_requests": 1,
        "unpriced_tokens": 8,
        "estimated_requests": 0,
        "estimated_tokens": 0,
        "missing_requests": 0,
        "cost_per_completed_interaction": "0.000285718",
    }
    rows = list(csv.DictReader(io.StringIO(billing.to_csv(statement).decode())))
    assert [row["priced"] for row in rows] == ["true", "true", "false", ""]
    assert {rows[2][k] for k in ("currency", *unknown)} == {""}
    total = rows[-1]
    assert {
        k: total[k]
        for k in (
            "day",
            "currency",
            "cost_total",
            "cost_per_completed_interaction",
            "unpriced_requests",
            "unpriced_tokens",
            "unpriced_interaction_share",
        )
    } == {
        "day": "TOTAL",
        "currency": "USD",
        "cost_total": "0.000857155",
        "cost_per_completed_interaction": "0.000285718",
        "unpriced_requests": "1",
        "unpriced_tokens": "8",
        "unpriced_interaction_share": "0.250000000",
    }


def test_a_statement_with_nothing_priced_assumes_no_currency(database_url: str) -> None:
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    with transaction(sessions) as session:
        tenant = crud.create_tenant(session, name="u").id
    started = datetime(2026, 7, 1, 9, tzinfo=UTC)
    insert_records(engine, [record(1, tenant, started, Usage(5, 0, 0, 2), model="unpriced")])
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="u"),
            start=date(2026, 7, 1),
            end=date(2026, 7, 1),
        )
    engine.dispose()
    document = orjson.loads(billing.to_json(statement))
    assert document["currency"] is None
    totals = document["totals"]
    assert (totals["cost_total"], totals["cost_per_completed_interaction"]) == (
        "0.000000000",
        None,
    )
    assert (totals["unpriced_requests"], totals["unpriced_interaction_share"]) == (
        1,
        "1.000000000",
    )
    assert "USD" not in billing.to_csv(statement).decode()


def test_statement_periods_are_checked(world) -> None:  # type: ignore[no-untyped-def]
    sessions, *_ = world
    with sessions() as session, pytest.raises(InvalidRequest):
        billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="a"),
            start=date(2026, 7, 2),
            end=date(2026, 7, 1),
        )


def test_many_small_costs_sum_exactly(database_url: str) -> None:
    """10,000 nano-dollar-precise costs: SQL sum equals the Decimal sum, to the digit."""
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    tenant = tenants(engine, "t", prices=[JUL])["t"].id
    start = datetime(2026, 8, 1, tzinfo=UTC)
    records = [
        record(n, tenant, start + timedelta(seconds=n), Usage(n % 997 + 1, n % 13, 0, n % 7))
        for n in range(10_000)
    ]
    insert_records(engine, records)
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="t"),
            start=date(2026, 8, 1),
            end=date(2026, 8, 1),
        )
    engine.dispose()
    assert statement.totals.sums.cost_total == sum((r.cost.total for r in records), D(0))


TIERED = price(
    "t",
    "2026-01-01",
    input="3",
    cache_read="0.30",
    output="15",
    cache_write="3.75",
    cache_write_1h="6",
    long_context={
        "above": 200000,
        "input": "6",
        "cache_read": "0.60",
        "cache_write": "7.50",
        "cache_write_1h": "12",
        "output": "22.50",
    },
    tiers={"priority": {"input": "5", "cache_read": "0.50", "cache_write": "6.25", "output": "25"}},
)


def test_lines_show_the_rate_set_each_request_was_priced_with(database_url: str) -> None:
    """Standard, long-context and priority-tier requests of one entry are separate lines,
    each with the rates actually applied (1-hour writes at their own rate)."""
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    tenant_id = tenants(engine, "tiered", prices=[TIERED])["tiered"].id
    started = datetime(2026, 3, 1, 12, tzinfo=UTC)
    attempts = [
        ("std", Usage(1000, 2000, 500, 100, cache_write_1h_tokens=100), None),
        ("long", Usage(150000, 60000, 0, 10), None),  # 210,000 prompt tokens > 200,000
        ("prio", Usage(1000, 0, 200, 10, cache_write_1h_tokens=200), "priority"),
    ]
    records = [
        make_record(
            name,
            tenant_id=tenant_id,
            model="t",
            upstream="anthropic/t",
            started_at=started,
            usage=usage,
            prices=TIERED,
            service_tier=tier,
        )
        for name, usage, tier in attempts
    ]
    assert [r.rate_class for r in records] == ["standard", "long_context", "priority"]
    insert_records(engine, records)
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="tiered"),
            start=date(2026, 3, 1),
            end=date(2026, 3, 1),
        )
    engine.dispose()
    lines = []
    for item in statement.lines:
        assert item.rates is not None
        lines.append(
            (
                item.rate_class,
                item.sums.cache_write_tokens,
                item.sums.cache_write_1h_tokens,
                item.rates.input,
                item.rates.cache_read,
                item.rates.cache_write,
                item.rates.cache_write_1h,
                item.rates.output,
                item.sums.cost_total,
            )
        )
    assert lines == [
        # 150000 × 6 + 60000 × 0.60 + 10 × 22.50 (per 1M) = 0.9 + 0.036 + 0.000225
        ("long_context", 0, 0, D(6), D("0.6"), D("7.5"), D(12), D("22.5"), D("0.936225")),
        # 1000 × 5 + 200 × 6.25 (1-hour writes at the tier's write rate) + 10 × 25
        ("priority", 200, 200, D(5), D("0.5"), D("6.25"), D("6.25"), D(25), D("0.0065")),
        # 1000 × 3 + 2000 × 0.30 + (400 × 3.75 + 100 × 6) + 100 × 15 = 3 + 0.6 + 2.1 + 1.5 (µ$)
        ("standard", 500, 100, D(3), D("0.3"), D("3.75"), D(6), D(15), D("0.0072")),
    ]
    assert statement.totals.sums.cache_write_1h_tokens == 300
    assert statement.totals.sums.cost_total == D("0.949925")
