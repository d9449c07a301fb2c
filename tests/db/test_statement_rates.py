"""A statement line's rates reproduce its cost: tokens × rates, to the nano-dollar.

Each request's cost per class is rounded half-even to the nano-dollar, so tokens × rates
reproduces a line of many requests exactly when every product needs at most nine decimal
places: the rates here have at most three (per million tokens), as providers' lists do.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson

from gateway import billing
from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.db import crud
from gateway.db.session import make_engine, session_factory, transaction
from gateway.usage import Usage, UsageSource
from pricing.book import Price, PriceBook, price_from_mapping
from tests.factories import record as make_record

D = Decimal
M = Decimal(1_000_000)
PRICES = [
    price_from_mapping(
        {
            "model": "claude",
            "effective_from": "2026-01-01",
            "input": "3",
            "cache_read": "0.3",
            "cache_write": "3.75",
            "cache_write_1h": "0",  # a 1-hour write rate of 0 is a rate, not "none"
            "output": "15",
            # No write rates here: 5-minute writes at input, 1-hour at the 5-minute rate.
            "long_context": {"above": 1000, "input": "6", "cache_read": "0.6", "output": "22.5"},
            "tiers": {
                # No 1-hour rate: 1-hour writes at this tier's 5-minute rate.
                "priority": {
                    "input": "5",
                    "cache_read": "0.5",
                    "cache_write": "6.25",
                    "output": "25",
                },
                "flex": {
                    "input": "0",
                    "cache_read": "0",
                    "cache_write": "0",
                    "cache_write_1h": "0",
                    "output": "0",
                },
            },
        }
    ),
    # No write rates at all, and a cache-read rate of 0.
    price_from_mapping(
        {
            "model": "plain",
            "effective_from": "2026-01-01",
            "input": "0.2",
            "cache_read": "0",
            "output": "0.6",
        }
    ),
    # A 5-minute write rate of 0 beside a 1-hour one.
    price_from_mapping(
        {
            "model": "free-writes",
            "effective_from": "2026-01-01",
            "input": "1",
            "cache_read": "0.125",
            "cache_write": "0",
            "cache_write_1h": "2",
            "output": "2",
        }
    ),
]
STARTED = datetime(2026, 3, 1, 9, tzinfo=UTC)
# (model, service tier, usage source, usage): two or more requests per line where it matters.
ATTEMPTS: list[tuple[str, str | None, UsageSource, Usage]] = [
    ("claude", None, UsageSource.REPORTED, Usage(100, 200, 300, 40, cache_write_1h_tokens=120)),
    ("claude", None, UsageSource.REPORTED, Usage(7, 0, 50, 3, cache_write_1h_tokens=50)),
    ("claude", None, UsageSource.ESTIMATED, Usage(333, 0, 0, 17)),
    ("claude", None, UsageSource.REPORTED, Usage(900, 300, 100, 9, cache_write_1h_tokens=40)),
    ("claude", None, UsageSource.REPORTED, Usage(1001, 0, 0, 1)),  # long context, as is r3
    ("claude", "priority", UsageSource.REPORTED, Usage(10, 20, 30, 4, cache_write_1h_tokens=10)),
    ("claude", "priority", UsageSource.REPORTED, Usage(1, 2, 3, 5, cache_write_1h_tokens=3)),
    # A tier wins over long context (1,500 prompt tokens).
    ("claude", "flex", UsageSource.REPORTED, Usage(500, 500, 500, 500, cache_write_1h_tokens=250)),
    ("plain", None, UsageSource.REPORTED, Usage(1234, 567, 89, 10, cache_write_1h_tokens=9)),
    ("plain", None, UsageSource.ESTIMATED, Usage(11, 0, 0, 13)),
    ("free-writes", None, UsageSource.REPORTED, Usage(10, 80, 60, 6, cache_write_1h_tokens=25)),
    ("free-writes", None, UsageSource.REPORTED, Usage(3, 8, 6, 1, cache_write_1h_tokens=6)),
]


def records(tenant_id: str) -> list[Record]:
    """Priced as the request path prices them (the entry in force, the tier's rates)."""
    book = PriceBook(PRICES)
    made = []
    for n, (model, tier, source, usage) in enumerate(ATTEMPTS):
        estimated = source is UsageSource.ESTIMATED
        made.append(
            make_record(
                f"r{n}",
                tenant_id=tenant_id,
                interaction_id=f"i{n}",
                model=model,
                upstream=f"provider/{model}",
                policy="fallback",
                stream=estimated,
                started_at=STARTED + timedelta(minutes=n),
                status=Status.CANCELLED if estimated else Status.COMPLETED,
                usage=Usage(
                    usage.uncached_tokens,
                    usage.cache_read_tokens,
                    usage.cache_write_tokens,
                    usage.output_tokens,
                    source=source,
                    cache_write_1h_tokens=usage.cache_write_1h_tokens,
                ),
                prices=book,
                service_tier=tier,
            )
        )
    return made


def recomputed(line: dict[str, Any]) -> dict[str, Decimal]:
    """A JSON line item's money, from nothing but its own tokens and rates."""
    rate = {name: D(line[name]) for name in billing.RATES}
    tokens = {name: int(line[name]) for name in ("uncached_tokens", "cache_read_tokens")}
    writes, hour = int(line["cache_write_tokens"]), int(line["cache_write_1h_tokens"])
    output = int(line["output_tokens"])
    classes = {
        "cost_uncached": tokens["uncached_tokens"] * rate["input_rate"] / M,
        "cost_cache_read": tokens["cache_read_tokens"] * rate["cache_read_rate"] / M,
        "cost_cache_write": (
            (writes - hour) * rate["cache_write_rate"] + hour * rate["cache_write_1h_rate"]
        )
        / M,
        "cost_output": output * rate["output_rate"] / M,
    }
    prompt = tokens["uncached_tokens"] + tokens["cache_read_tokens"] + writes
    return {
        **classes,
        "cost_total": sum(classes.values(), D(0)),
        "cost_uncached_equivalent": (prompt * rate["input_rate"] + output * rate["output_rate"])
        / M,
    }


def test_every_line_of_a_statement_mixing_all_rate_classes_reproduces_its_cost(
    database_url: str,
) -> None:
    """Standard, long-context and tier lines; 5-minute and 1-hour writes; zero rates and
    missing write rates that fall back: every line's tokens × its shown rates equals its
    cost exactly, in every class, in JSON and in CSV."""
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    with transaction(sessions) as session:
        crud.add_prices(session, prices=PRICES)
        tenant_id = crud.create_tenant(session, name="rates").id
    made = records(tenant_id)
    insert_records(engine, made)
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="rates"),
            start=date(2026, 3, 1),
            end=date(2026, 3, 1),
        )
    engine.dispose()
    document = orjson.loads(billing.to_json(statement))
    lines = document["line_items"]
    assert [
        (li["model"], li["rate_class"], li["usage_source"], li["requests"]) for li in lines
    ] == [
        ("claude", "flex", "reported", 1),
        ("claude", "long_context", "reported", 2),  # 1,300 and 1,001 prompt tokens
        ("claude", "priority", "reported", 2),
        ("claude", "standard", "reported", 2),
        ("claude", "standard", "estimated", 1),
        ("free-writes", "standard", "reported", 2),
        ("plain", "standard", "reported", 1),
        ("plain", "standard", "estimated", 1),
    ]
    for line in lines:
        assert {name: D(line[name]) for name in recomputed(line)} == recomputed(line), line
    assert sum((D(line["cost_total"]) for line in lines), D(0)) == sum(
        (r.cost.total for r in made), D(0)
    )
    rows = list(csv.DictReader(io.StringIO(billing.to_csv(statement).decode())))
    for row in rows[:-1]:
        assert {name: D(row[name]) for name in recomputed(row)} == recomputed(row), row
    # The rates shown are the ones applied, fallbacks resolved and zeros kept as zeros.
    shown = {
        (line["model"], line["rate_class"]): tuple(line[name] for name in billing.RATES)
        for line in lines
    }
    assert shown[("claude", "standard")] == (
        "3.000000000",
        "0.300000000",
        "3.750000000",
        "0.000000000",  # the entry's 1-hour rate of 0, not the 5-minute rate
        "15.000000000",
    )
    assert shown[("claude", "long_context")][2:4] == ("6.000000000", "6.000000000")
    assert shown[("claude", "priority")][2:4] == ("6.250000000", "6.250000000")
    assert shown[("claude", "flex")] == ("0.000000000",) * 5
    assert shown[("plain", "standard")][1:4] == ("0.000000000", "0.200000000", "0.200000000")
    assert shown[("free-writes", "standard")][2:4] == ("0.000000000", "2.000000000")


def test_a_zero_one_hour_rate_is_charged_and_shown_as_zero(database_url: str) -> None:
    """The probe's case: 1-hour writes at a 1-hour rate of 0 cost 0 and the line says 0."""
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    price: Price = PRICES[0]
    with transaction(sessions) as session:
        crud.add_prices(session, prices=[price])
        tenant_id = crud.create_tenant(session, name="hour").id
    [made] = [r for r in records(tenant_id) if r.request_id == "r1"]
    assert made.cost.cache_write == D(0)  # 50 one-hour writes at 0
    insert_records(engine, [made])
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="hour"),
            start=date(2026, 3, 1),
            end=date(2026, 3, 1),
        )
    engine.dispose()
    [line] = statement.lines
    assert line.rates is not None
    assert (line.rates.cache_write, line.rates.cache_write_1h) == (D("3.75"), D(0))
    assert line.sums.cost_cache_write == D(0)
