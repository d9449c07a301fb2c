"""The shared budget counters (gateway/db/spend.py) on real SQLite and Postgres: exact
reservations, a zero budget, settlement, a period's turnover at its boundary (time passed
in), and alerts claimed once."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select

from gateway.budgets import DEFAULT_ALERTS, Period, parse_scope
from gateway.db import spend
from gateway.db.migrate import upgrade
from gateway.db.models import BudgetCounterRow, BudgetHoldRow
from gateway.db.session import make_engine, session_factory, transaction
from gateway.errors import NotFound
from tests.factories import tenants


def _budget(url: str, limit: str, period: Period = Period.DAY, zone: str = "UTC") -> tuple:
    upgrade(url)
    engine = make_engine(url)
    tenants(engine, "acme")
    factory = session_factory(engine)
    with transaction(factory) as session:
        budget = spend.set_budget(
            session,
            scope=parse_scope("tenant:acme"),
            limit=Decimal(limit),
            period=period,
            timezone=zone,
            alert_at=DEFAULT_ALERTS,
        )
    return factory, budget


def _charge(budget: spend.Budget, at: datetime, amount: str) -> spend.Charge:
    start, _ = budget.bounds(at)
    return spend.Charge(budget.id, "", start, budget.limit, Decimal(amount))


def _reserve(factory, charge: spend.Charge) -> bool:  # type: ignore[no-untyped-def]
    with factory() as session, session.begin():
        short = spend.reserve(session, [charge])
        if short is not None:
            session.rollback()
        return short is None


def test_reservations_fit_to_the_nano_dollar_and_settle_to_the_cost(
    empty_database_url: str,
) -> None:
    factory, budget = _budget(empty_database_url, "1.000000000")
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    first = _charge(budget, at, "0.600000000")
    assert _reserve(factory, first)
    assert not _reserve(factory, _charge(budget, at, "0.400000001"))
    assert _reserve(factory, _charge(budget, at, "0.400000000"))
    assert not _reserve(factory, _charge(budget, at, "0.000000001"))  # full: nothing fits
    with transaction(factory) as session:
        [(_, spent)] = spend.settle(session, [first], Decimal("0.123456789"))
    assert spent == Decimal("0.123456789")
    with factory() as session:
        assert spend.counter(session, budget.id, first.period_start) == (
            Decimal("0.123456789"),
            Decimal("0.400000000"),
        )


def test_a_zero_budget_takes_nothing_not_even_a_free_request(empty_database_url: str) -> None:
    factory, budget = _budget(empty_database_url, "0")
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert not _reserve(factory, _charge(budget, at, "0.000000001"))
    assert not _reserve(factory, _charge(budget, at, "0"))


def test_a_day_turns_over_at_midnight_in_the_budgets_zone(empty_database_url: str) -> None:
    factory, budget = _budget(empty_database_url, "1", zone="America/New_York")
    before = datetime(2026, 12, 2, 4, 59, 59, 999999, tzinfo=UTC)  # 23:59:59.999999 in NY
    charge = _charge(budget, before, "1")
    assert _reserve(factory, charge)
    with transaction(factory) as session:
        spend.settle(session, [charge], Decimal("1"))
    assert not _reserve(factory, _charge(budget, before, "0.000000001"))
    midnight = before + timedelta(microseconds=1)
    after = _charge(budget, midnight, "1")
    assert after.period_start == datetime(2026, 12, 2, 5, tzinfo=UTC)
    assert _reserve(factory, after)
    with factory() as session:
        assert spend.counter(session, budget.id, charge.period_start)[0] == Decimal(1)


def test_each_threshold_is_claimed_once_per_period(empty_database_url: str) -> None:
    factory, budget = _budget(empty_database_url, "1")
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    charge = _charge(budget, at, "0")
    claims = []
    for _ in range(3):
        with transaction(factory) as session:
            claims.append(spend.claim_alert(session, charge, Decimal("0.5"), Decimal("0.6"), "x"))
    assert claims == [True, False, False]
    tomorrow = _charge(budget, at + timedelta(days=1), "0")
    with transaction(factory) as session:
        assert spend.claim_alert(session, tomorrow, Decimal("0.5"), Decimal("0.6"), "x")


def test_a_dead_gateways_holds_return_once_and_a_late_settlement_counts_only_its_cost(
    empty_database_url: str,
) -> None:
    factory, budget = _budget(empty_database_url, "1")
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    charge = _charge(budget, at, "0.7")
    with transaction(factory) as session:
        assert spend.reserve(session, [charge], holder="req_a", expires_at=at) is None
        assert (
            spend.reserve(
                session,
                [_charge(budget, at, "0.2")],
                holder="req_b",
                expires_at=at + timedelta(minutes=1),
            )
            is None
        )
    with transaction(factory) as session:
        spend.renew(session, ["req_b"], at + timedelta(minutes=5))
        assert spend.sweep(session, at + timedelta(seconds=1)) == 1  # req_a's only
    with transaction(factory) as session:
        assert spend.sweep(session, at + timedelta(minutes=2)) == 0  # req_b was renewed
    with factory() as session:
        assert spend.counter(session, budget.id, charge.period_start) == (0, Decimal("0.2"))
    with transaction(factory) as session:  # req_a was alive after all: its cost counts
        spend.settle(session, [charge], Decimal("0.1"), holder="req_a")
    with factory() as session:
        assert spend.counter(session, budget.id, charge.period_start) == (
            Decimal("0.1"),
            Decimal("0.2"),
        )


def _lease(
    budget: spend.Budget, start: datetime, holder: str, **fields: Decimal
) -> spend.LeaseSync:
    values = {"spent": Decimal(0), "want": Decimal(0), "floor": Decimal(0), **fields}
    return spend.LeaseSync(
        holder=holder,
        budget_id=budget.id,
        subject="",
        period_start=start,
        limit=budget.limit,
        expires_at=start + timedelta(days=1),
        **values,
    )


def test_leases_never_hold_more_than_the_limit_and_flush_exactly(empty_database_url: str) -> None:
    factory, budget = _budget(empty_database_url, "1")
    start, _ = budget.bounds(datetime(2026, 12, 1, 12, tzinfo=UTC))

    def sync(lease: spend.LeaseSync) -> tuple[Decimal, Decimal]:
        with transaction(factory) as session:
            return spend.sync_lease(session, lease)

    assert sync(_lease(budget, start, "lease:a", want=Decimal("0.6"))) == (Decimal("0.6"), 0)
    # B asks for as much: it gets what is left, no more.
    assert sync(_lease(budget, start, "lease:b", want=Decimal("0.6"))) == (Decimal("0.4"), 0)
    # A spent 0.5 of its slice and wants 0.6 unspent again: B holds the rest, so A keeps
    # the 0.1 it did not spend.
    assert sync(_lease(budget, start, "lease:a", spent=Decimal("0.5"), want=Decimal("0.6"))) == (
        Decimal("0.1"),
        Decimal("0.5"),
    )
    # B goes idle: its slice returns, and A can grow into it.
    assert sync(_lease(budget, start, "lease:b")) == (0, Decimal("0.5"))
    assert sync(_lease(budget, start, "lease:a", want=Decimal("0.6"))) == (
        Decimal("0.5"),
        Decimal("0.5"),
    )
    with factory() as session:
        assert spend.counter(session, budget.id, start) == (Decimal("0.5"), Decimal("0.5"))
    # The limit lowered to 0.7: A gives back all it holds beyond, except what is in flight.
    lower = _lease(budget, start, "lease:a", want=Decimal("0.6"), floor=Decimal("0.1"))
    assert sync(replace(lower, limit=Decimal("0.7"))) == (Decimal("0.2"), Decimal("0.5"))
    with factory() as session:
        assert spend.counter(session, budget.id, start) == (Decimal("0.5"), Decimal("0.2"))
    # Swept (its worker thought dead), A's lease is taken again from what is free.
    with transaction(factory) as session:
        assert spend.sweep(session, start + timedelta(days=2)) == 1
    assert sync(_lease(budget, start, "lease:a", spent=Decimal("0.1"), want=Decimal("1"))) == (
        Decimal("0.4"),
        Decimal("0.6"),
    )


def test_setting_again_changes_the_same_row_and_deleting_takes_what_names_it(
    empty_database_url: str,
) -> None:
    """A budget set twice on one scope and period is one row (its id kept); deleting it
    takes its counters and holds, deleting a rate limit takes its minutes' counters and
    the slices held of them, and an unknown id is a 404 naming it."""
    factory, budget = _budget(empty_database_url, "1.000000000")
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert _reserve_held(factory, _charge(budget, at, "0.250000000"))
    scope = parse_scope("tenant:acme")
    with transaction(factory) as session:
        again = spend.set_budget(
            session, scope=scope, limit=Decimal(2), period=Period.DAY, alert_at=()
        )
        limit = spend.set_limit(session, scope=scope, requests_per_minute=5, tokens_per_minute=None)
        same = spend.set_limit(session, scope=scope, requests_per_minute=7, tokens_per_minute=9)
    requests, tokens = spend.window_counters(limit.id)
    minute = at.replace(second=0)
    for name, cap in ((requests, 7), (tokens, 9)):
        with transaction(factory) as session:
            held = spend.sync_lease(
                session,
                spend.LeaseSync(
                    holder="lease:a:0",
                    budget_id=name,
                    subject="",
                    period_start=minute,
                    limit=Decimal(cap),
                    spent=Decimal(0),
                    want=Decimal(4),
                    floor=Decimal(0),
                    expires_at=at + timedelta(minutes=1),
                ),
            )
        assert held == (Decimal(4), Decimal(0))
    assert (again.id, again.limit, again.alert_at) == (budget.id, Decimal(2), ())
    assert (same.id, same.requests_per_minute, same.tokens_per_minute) == (limit.id, 7, 9)
    with transaction(factory) as session:
        assert spend.delete_budget(session, budget_id=budget.id) == again
        assert spend.delete_limit(session, limit_id=limit.id) == same
    with transaction(factory) as session:
        assert spend.list_budgets(session) == [] and spend.list_limits(session) == []
        assert session.scalars(select(BudgetCounterRow)).all() == []
        assert session.scalars(select(BudgetHoldRow)).all() == []
    with transaction(factory) as session, pytest.raises(NotFound) as gone:
        spend.delete_budget(session, budget_id=budget.id)
    assert gone.value.message == f"no budget with id {budget.id!r}"
    with transaction(factory) as session, pytest.raises(NotFound) as gone:
        spend.delete_limit(session, limit_id=limit.id)
    assert gone.value.message == f"no rate limit with id {limit.id!r}"


def _reserve_held(factory, charge: spend.Charge) -> bool:  # type: ignore[no-untyped-def]
    with factory() as session, session.begin():
        return spend.reserve(session, [charge], holder="req_1") is None
