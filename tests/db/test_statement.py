"""Statements: line items per day × model × price entry; totals are exact sums."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import orjson
import pytest

from gateway import billing
from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.db import crud
from gateway.db.session import make_engine, session_factory
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
            item.requests,
            item.completed_interactions,
            item.uncached_tokens,
            item.cache_read_tokens,
            item.output_tokens,
            item.cost_total,
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
    assert statement.totals.cost_total == sum((r.cost.total for r in own), D(0))
    assert statement.totals.cost_total == D("0.000857155")
    assert statement.totals.requests == 5
    assert statement.totals.completed_interactions == 4
    assert statement.totals.cost_per_completed_interaction == D("0.000214289")  # 0.00021428875
    assert statement.lines[0].input_rate == D("0.200000000")
    assert statement.lines[2].input_rate is None


def test_a_statement_holds_nothing_of_another_tenant(world) -> None:  # type: ignore[no-untyped-def]
    sessions, _a, b_id, _records = world
    with sessions() as session:
        tenant = crud.get_tenant(session, name="b")
        statement = billing.build_statement(
            session, tenant=tenant, start=date(2026, 1, 1), end=date(2026, 12, 31)
        )
    assert tenant.id == b_id and statement.tenant_id == b_id
    assert [(item.requests, item.uncached_tokens, item.cost_total) for item in statement.lines] == [
        (1, 10**6, D("0.150000000"))
    ]


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
    assert statement.totals.requests == 3


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
    assert document["line_items"][2]["cost_total"] == "0.000000000"
    assert document["line_items"][0]["input_rate"] == "0.200000000"
    rows = billing.to_csv(statement).decode().splitlines()
    assert rows[0] == (
        "day,model,price_id,rate_class,currency,requests,completed_interactions,"
        "uncached_tokens,cache_read_tokens,cache_write_tokens,cache_write_1h_tokens,"
        "output_tokens,input_rate,cache_read_rate,cache_write_rate,cache_write_1h_rate,"
        "output_rate,cost_uncached,cost_cache_read,cost_cache_write,cost_output,cost_total"
    )
    assert rows[-1].split(",")[0] == "TOTAL"
    assert rows[-1].split(",")[-1] == "0.000857155"


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
    assert statement.totals.cost_total == sum((r.cost.total for r in records), D(0))


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
    lines = [
        (
            item.rate_class,
            item.cache_write_tokens,
            item.cache_write_1h_tokens,
            item.input_rate,
            item.cache_read_rate,
            item.cache_write_rate,
            item.cache_write_1h_rate,
            item.output_rate,
            item.cost_total,
        )
        for item in statement.lines
    ]
    assert lines == [
        # 150000 × 6 + 60000 × 0.60 + 10 × 22.50 (per 1M) = 0.9 + 0.036 + 0.000225
        ("long_context", 0, 0, D(6), D("0.6"), D("7.5"), D(12), D("22.5"), D("0.936225")),
        # 1000 × 5 + 200 × 6.25 (1-hour writes at the tier's write rate) + 10 × 25
        ("priority", 200, 200, D(5), D("0.5"), D("6.25"), D("6.25"), D(25), D("0.0065")),
        # 1000 × 3 + 2000 × 0.30 + (400 × 3.75 + 100 × 6) + 100 × 15 = 3 + 0.6 + 2.1 + 1.5 (µ$)
        ("standard", 500, 100, D(3), D("0.3"), D("3.75"), D(6), D(15), D("0.0072")),
    ]
    assert statement.totals.cache_write_1h_tokens == 300
    assert statement.totals.cost_total == D("0.949925")
