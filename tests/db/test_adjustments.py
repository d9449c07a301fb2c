"""Price corrections: exact deltas per tenant × UTC day × model, written as adjustments
beside the records (never over them), once, and shown on statements after the lines."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
from sqlalchemy import func, select

from gateway import billing
from gateway.db import adjustments, crud
from gateway.db.models import PriceAdjustmentRow, RequestRow
from gateway.db.session import SessionFactory, make_engine, session_factory, transaction
from tests.support.corrections import CORRECTED, ENTRY, EXPECTED, corrections_world

D = Decimal
NOW = datetime(2026, 8, 3, 12, tzinfo=UTC)


@pytest.fixture
def world(database_url: str) -> Iterator[tuple[SessionFactory, dict[str, str]]]:
    engine = make_engine(database_url)
    ids = corrections_world(engine)
    yield session_factory(engine), ids
    engine.dispose()


def fix(reason: str = "input and cache read were keyed in wrong", **rates: Decimal) -> Any:
    chosen = {**CORRECTED, **rates}
    return adjustments.correction(
        ENTRY,
        input=chosen["input"],
        cache_read=chosen["cache_read"],
        cache_write=None,
        output=None,
        reason=reason,
        by="ops",
    )


def table(lines: list[adjustments.Line], ids: dict[str, str]) -> list[tuple[Any, ...]]:
    names = {v: k for k, v in ids.items()}
    return sorted(
        (names[line.tenant_id], line.day, line.requests, line.billed, line.corrected, line.delta)
        for line in lines
    )


def expected() -> list[tuple[Any, ...]]:
    return [(e.tenant, e.day, e.requests, e.billed, e.corrected, e.delta) for e in EXPECTED]


def stored_costs(sessions: SessionFactory) -> list[tuple[str, Decimal]]:
    with sessions() as session:
        rows = session.execute(
            select(RequestRow.request_id, RequestRow.cost_total).order_by(RequestRow.request_id)
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


def adjustment_count(sessions: SessionFactory) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(PriceAdjustmentRow)) or 0)


def test_the_plan_reprices_every_request_of_the_entry_to_the_nano_dollar(world: Any) -> None:
    """Standard requests at the corrected rates, long-context and tier requests at the
    entry's own (unchanged) rates, each class rounded per request; another entry's
    requests are not in it, and nothing is written."""
    sessions, ids = world
    with sessions() as session:
        lines = adjustments.plan(session, fix())
    assert table(lines, ids) == expected()
    assert {line.model for line in lines} == {"m"}
    assert adjustment_count(sessions) == 0


def test_applying_writes_adjustments_and_never_touches_the_records(world: Any) -> None:
    sessions, ids = world
    before = stored_costs(sessions)
    with transaction(sessions) as session:
        lines = adjustments.apply(session, fix(), now=NOW)
    assert table(lines, ids) == expected()
    assert stored_costs(sessions) == before
    with sessions() as session:
        rows = session.scalars(select(PriceAdjustmentRow).order_by(PriceAdjustmentRow.delta))
        stored = [
            (
                r.price_id,
                r.day,
                r.model,
                r.requests,
                r.billed,
                r.corrected,
                r.delta,
                orjson.loads(r.corrected_rates),
                r.reason,
                r.created_by,
                r.created_at,
                r.correction_key,
            )
            for r in rows
        ]
    rates = {
        "input": "0.3333",
        "cache_read": "0.0333",
        "cache_write": "0.25",
        "cache_write_1h": "0.4",
        "output": "0.6",
    }
    common = (rates, "input and cache read were keyed in wrong", "ops", NOW, fix().key)
    assert stored == [
        (
            ENTRY.id,
            date(2026, 7, 2),
            "m",
            2,
            D("0.000007210"),
            D("0.000008183"),
            D("0.000000973"),
            *common,
        ),
        (
            ENTRY.id,
            date(2026, 7, 1),
            "m",
            1,
            D("0.000200000"),
            D("0.000333300"),
            D("0.000133300"),
            *common,
        ),
        (
            ENTRY.id,
            date(2026, 7, 1),
            "m",
            2,
            D("0.001432000"),
            D("0.001571950"),
            D("0.000139950"),
            *common,
        ),
    ]


def test_applying_the_same_correction_twice_changes_nothing(world: Any) -> None:
    """The second time, what is billed (records + adjustments) is already the corrected
    cost: every delta is 0 and nothing is written; the same rates written otherwise
    ("0.33330") are the same correction."""
    sessions, _ = world
    with transaction(sessions) as session:
        adjustments.apply(session, fix(), now=NOW)
    same = fix(input=D("0.33330"))
    assert same.key == fix().key
    with transaction(sessions) as session:
        again = adjustments.apply(session, same, now=NOW)
        assert adjustments.applied_before(session, same) == 3
    assert [line.delta for line in again] == [D("0E-9")] * 3
    assert sorted(line.billed for line in again) == sorted(e.corrected for e in EXPECTED)
    assert adjustment_count(sessions) == 3


def test_a_second_correction_adjusts_relative_to_what_is_billed_and_adjusted(
    world: Any,
) -> None:
    sessions, ids = world
    with transaction(sessions) as session:
        adjustments.apply(session, fix(), now=NOW)
    second = fix(input=D("0.25"), cache_read=D("0.02"))
    assert second.key != fix().key
    with transaction(sessions) as session:
        lines = adjustments.apply(session, second, now=NOW)
    names = {v: k for k, v in ids.items()}
    relative = {
        (names[line.tenant_id], line.day): (
            line.recorded,
            line.adjusted,
            line.corrected,
            line.delta,
        )
        for line in lines
    }
    assert relative == {
        # r1: 1000 × 0.25 + 500 × 0.02 + 0.00009 + 0.00012 = 0.00047; r2 0.001012
        ("a", date(2026, 7, 1)): (
            D("0.001432000"),
            D("0.000139950"),
            D("0.001482000"),
            D("-0.000089950"),
        ),
        # r3 0.00000515; r4: 7 × 0.25 = 0.00000175 + 0.00000006 + 0.0000006
        ("a", date(2026, 7, 2)): (
            D("0.000007210"),
            D("0.000000973"),
            D("0.000007560"),
            D("-0.000000623"),
        ),
        # 1000 × 0.25 = 0.00025
        ("b", date(2026, 7, 1)): (
            D("0.000200000"),
            D("0.000133300"),
            D("0.000250000"),
            D("-0.000083300"),
        ),
    }
    assert adjustment_count(sessions) == 6
    with sessions() as session:
        # Records plus every adjustment are now what the second correction says.
        final = adjustments.plan(session, second)
    assert [row[3] for row in table(final, ids)] == [
        D("0.001482000"),
        D("0.000007560"),
        D("0.000250000"),
    ]
    assert all(line.delta == 0 for line in final)


def test_an_unknown_entry_is_not_found(world: Any) -> None:
    sessions, _ = world
    with sessions() as session, pytest.raises(Exception, match="no price entry 'm@1999"):
        adjustments.entry(session, "m@1999-01-01T00:00:00Z")


def test_statements_show_the_lines_then_the_adjustments_then_totals_before_and_after(
    world: Any,
) -> None:
    sessions, _ = world
    with sessions() as session:
        tenant = crud.get_tenant(session, name="a")
        unadjusted = billing.build_statement(
            session, tenant=tenant, start=date(2026, 7, 1), end=date(2026, 7, 2)
        )
    with transaction(sessions) as session:
        adjustments.apply(session, fix(), now=NOW)
    with sessions() as session:
        statement = billing.build_statement(
            session, tenant=tenant, start=date(2026, 7, 1), end=date(2026, 7, 2)
        )
    # The lines are the records' own, as before the correction.
    assert statement.lines == unadjusted.lines
    assert statement.totals == unadjusted.totals
    document = orjson.loads(billing.to_json(statement))
    assert list(document)[-4:] == ["line_items", "adjustments", "totals", "adjusted_totals"]
    assert [
        (
            a["day"],
            a["model"],
            a["price_id"],
            a["requests"],
            a["billed"],
            a["corrected"],
            a["delta"],
        )
        for a in document["adjustments"]
    ] == [
        ("2026-07-01", "m", ENTRY.id, 2, "0.001432000", "0.001571950", "0.000139950"),
        ("2026-07-02", "m", ENTRY.id, 2, "0.000007210", "0.000008183", "0.000000973"),
    ]
    first = document["adjustments"][0]
    assert (first["currency"], first["by"], first["created_at"]) == (
        "USD",
        "ops",
        "2026-08-03T12:00:00Z",
    )
    assert first["reason"] == "input and cache read were keyed in wrong"
    assert first["corrected_rates"]["input"] == "0.3333"
    # Lines: 0.001432 (Jul 1, standard + long context) + 0.00000721 (Jul 2) + r6's
    # 176 × 1 + 1024 × 0.1 + 30 × 2 = 0.0003384 of the other entry.
    assert document["totals"]["cost_total"] == "0.001777610"
    assert document["adjusted_totals"] == {
        "cost_total_before_adjustments": "0.001777610",
        "adjustment_total": "0.000140923",
        "cost_total_after_adjustments": "0.001918533",
    }
    rows = list(csv.DictReader(io.StringIO(billing.to_csv(statement).decode())))
    kinds = ["adjustment" if row["adjustment_id"] else row["day"] for row in rows]
    assert kinds == ["2026-07-01"] * 3 + ["2026-07-02"] * 2 + ["adjustment"] * 2 + ["TOTAL"]
    adjustment = rows[-3]
    assert {k: adjustment[k] for k in ("day", "model", "price_id", "currency", "requests")} == {
        "day": "2026-07-01",
        "model": "m",
        "price_id": ENTRY.id,
        "currency": "USD",
        "requests": "2",
    }
    assert (adjustment["adjustment_delta"], adjustment["cost_total"]) == ("0.000139950", "")
    assert adjustment["adjustment_rates"].startswith("input=0.3333;cache_read=0.0333;")
    total = rows[-1]
    assert (
        total["cost_total"],
        total["adjustment_total"],
        total["cost_total_after_adjustments"],
    ) == (
        "0.001777610",
        "0.000140923",
        "0.001918533",
    )
    # Tenant b's statement holds b's adjustment alone; a period without adjusted days none.
    with sessions() as session:
        other = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="b"),
            start=date(2026, 7, 1),
            end=date(2026, 7, 1),
        )
        later = billing.build_statement(
            session, tenant=tenant, start=date(2026, 7, 3), end=date(2026, 7, 31)
        )
    assert [a.delta for a in other.adjustments] == [D("0.000133300")]
    assert later.adjustments == () and later.adjusted_fields()["adjustment_total"] == D(0)


def test_adjusted_days_for_the_dashboard(world: Any) -> None:
    sessions, ids = world
    with transaction(sessions) as session:
        adjustments.apply(session, fix(), now=NOW)
    lower, upper = datetime(2026, 7, 1, tzinfo=UTC), datetime(2026, 8, 1, tzinfo=UTC)
    with sessions() as session:
        everyone = adjustments.adjusted_days(session, lower=lower, upper=upper)
        only_b = adjustments.adjusted_days(session, lower=lower, upper=upper, tenant_ids=[ids["b"]])
        other_model = adjustments.adjusted_days(session, lower=lower, upper=upper, models=["other"])
        july2 = adjustments.adjusted_days(
            session, lower=datetime(2026, 7, 2, tzinfo=UTC), upper=upper
        )
    assert everyone == [(date(2026, 7, 1), D("0.000273250")), (date(2026, 7, 2), D("0.000000973"))]
    assert only_b == [(date(2026, 7, 1), D("0.000133300"))]
    assert other_model == []
    assert july2 == [(date(2026, 7, 2), D("0.000000973"))]
