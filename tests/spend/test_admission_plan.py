"""Admission's per-caller plan (gateway/serving/admission.py ``Plan``): what the rules ask
of a caller is worked out once and reused while the rules, the minute and every budget's
period last. Each request still charges exactly what the rules in force at its moment
ask: a new period, a new minute, a rule set or deleted, an end user or tag a budget names,
all apply to the very next request. On real SQLite and Postgres."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy.engine import Engine

from gateway.budgets import DEFAULT_ALERTS, Budget, Period, parse_scope
from gateway.db import spend
from gateway.db.session import session_factory, transaction
from gateway.db.spend import from_units
from gateway.errors import BudgetExceeded
from gateway.mirror import Mirror
from gateway.serving.admission import Admission, Admitted, dearest_rates
from gateway.serving.context import Context
from gateway.serving.leases import Leases
from pricing.book import PriceBook
from tests.factories import BOOK, JAN, JUL, price, tenants
from tests.spend import workers
from tests.spend.test_rate_leases import Clock
from tests.spend.workers import context

# One chat request's largest cost at tests.factories.BOOK's prices for deployment m in
# December 2026 (input 0.15, output 0.45 per million): its 100 body bytes, a token each at
# most, at the dearest prompt rate, plus its 8 output tokens: 0.000015 + 0.0000036.
LARGEST = Decimal("0.000018600")


def _budget(engine: Engine, scope: str, limit: str, timezone: str = "UTC") -> Budget:
    with transaction(session_factory(engine)) as session:
        return spend.set_budget(
            session,
            scope=parse_scope(scope),
            limit=Decimal(limit),
            period=Period.DAY,
            timezone=timezone,
            alert_at=DEFAULT_ALERTS,
        )


def _following(engine: Engine, clock: Clock) -> tuple[Admission, Mirror[tuple[Budget, ...]]]:
    """A worker's admission, and the mirror of the budgets it follows (``reload``: the
    gateway's change feed, in one call)."""
    factory = session_factory(engine)

    def load() -> tuple[int, tuple[Budget, ...]]:
        with factory() as session:
            return spend.load_budgets(session)

    budgets: Mirror[tuple[Budget, ...]] = Mirror("budgets", load, ())
    budgets.reload()
    admission = workers.worker(engine, clock)
    budgets.follow(lambda value: admission._install(budgets=value))
    return admission, budgets


def _as(
    ctx: Context, end_user: str | None = None, tags: tuple[tuple[str, str], ...] = ()
) -> Context:
    return replace(ctx, call=replace(ctx.call, end_user=end_user, tags=tags))


def _admit(admission: Admission, ctx: Context) -> Admitted:
    async def run() -> Admitted:
        admitted = await admission.admit(ctx)
        await admission.settle(admitted)
        return admitted

    return asyncio.run(run())


def _charged(admitted: Admitted) -> list[tuple[str, datetime, Decimal]]:
    return [(c.budget_id, c.period_start, c.amount) for c in admitted.leased]


def test_a_day_turning_over_between_two_requests_charges_the_new_day(engine: Engine) -> None:
    """Paris midnight is 23:00 UTC in December: one request just before, one just after."""
    [acme] = tenants(engine, "acme").values()
    budget = _budget(engine, "tenant:acme", "10", timezone="Europe/Paris")
    clock = Clock(datetime(2026, 12, 1, 22, 59, 59, 900_000, tzinfo=UTC))
    admission, _ = _following(engine, clock)
    before = _admit(admission, context(acme, 1))
    again = _admit(admission, context(acme, 2))  # the same plan, the same day
    clock.at = datetime(2026, 12, 1, 23, 0, 0, 100_000, tzinfo=UTC)
    after = _admit(admission, context(acme, 3))
    yesterday = datetime(2026, 11, 30, 23, tzinfo=UTC)
    today = datetime(2026, 12, 1, 23, tzinfo=UTC)
    assert _charged(before) == _charged(again) == [(budget.id, yesterday, LARGEST)]
    assert _charged(after) == [(budget.id, today, LARGEST)]


def test_a_caller_no_rule_matches_is_free_until_one_does(engine: Engine) -> None:
    """A budget on end user alice: bob's requests are free (and his plan says so) until a
    budget names bob; then his very next request is charged, and refused once it cannot
    be covered. Deleting it frees him again at once."""
    [acme] = tenants(engine, "acme").values()
    alice = _budget(engine, "user:acme/alice", "10")
    admission, budgets = _following(engine, Clock(datetime(2026, 12, 1, 12, tzinfo=UTC)))
    assert _charged(_admit(admission, _as(context(acme, 1), "alice")))[0][0] == alice.id
    for number in (2, 3):
        assert not _admit(admission, _as(context(acme, number), "bob")).holds

    bob = _budget(engine, "user:acme/bob", "0")  # a zero budget blocks
    budgets.reload()
    with pytest.raises(BudgetExceeded):
        _admit(admission, _as(context(acme, 4), "bob"))
    assert _charged(_admit(admission, _as(context(acme, 5), "alice")))[0][0] == alice.id

    with transaction(session_factory(engine)) as session:
        spend.delete_budget(session, budget_id=bob.id)
    budgets.reload()
    assert not _admit(admission, _as(context(acme, 6), "bob")).holds


def test_tags_are_part_of_the_caller(engine: Engine) -> None:
    """The same key and end user with and without the tag a budget names."""
    [acme] = tenants(engine, "acme").values()
    tagged = _budget(engine, "tag:acme/team=search", "10")
    admission, _ = _following(engine, Clock(datetime(2026, 12, 1, 12, tzinfo=UTC)))
    search = (("team", "search"),)
    assert _charged(_admit(admission, _as(context(acme, 1), tags=search)))[0][0] == tagged.id
    assert not _admit(admission, _as(context(acme, 2), tags=(("team", "ads"),))).holds
    assert not _admit(admission, context(acme, 3)).holds
    assert _charged(_admit(admission, _as(context(acme, 4), tags=search)))[0][0] == tagged.id


def test_each_request_reserves_its_own_largest_cost(engine: Engine) -> None:
    """The plan is per caller, the price per request: a larger body reserves more."""
    [acme] = tenants(engine, "acme").values()
    _budget(engine, "tenant:acme", "10")
    admission, _ = _following(engine, Clock(datetime(2026, 12, 1, 12, tzinfo=UTC)))
    small = _admit(admission, context(acme, 1))
    ctx = context(acme, 2)
    large = _admit(admission, replace(ctx, call=replace(ctx.call, body_bytes=100_000)))
    assert _charged(small)[0][2] == LARGEST
    assert _charged(large)[0][2] == Decimal("0.015003600")  # 100,000 x 0.15 + 8 x 0.45


def test_the_dearest_rates_follow_a_dated_price_and_a_new_book() -> None:
    """Model m's price changes on 1 July 2026 (tests.factories): the reservation's rates
    change at that very moment, back again before it, and with a book replaced."""
    july = datetime(2026, 7, 1, tzinfo=UTC)
    before, after = (Decimal("0.20"), Decimal("0.60")), (Decimal("0.15"), Decimal("0.45"))
    assert BOOK.in_force("m", at=july - timedelta(microseconds=1)) == (JAN, july)
    assert BOOK.in_force("m", at=july) == (JUL, None)
    assert BOOK.in_force("nobody", at=july) == (None, None)
    assert PriceBook([JUL]).in_force("m", at=july - timedelta(days=1)) == (None, july)

    deployment = workers.DEPLOYMENT
    assert dearest_rates(BOOK, deployment, july - timedelta(microseconds=1)) == (before,)
    assert dearest_rates(BOOK, deployment, july) == (after,)
    assert dearest_rates(BOOK, deployment, july + timedelta(days=30)) == (after,)
    assert dearest_rates(BOOK, deployment, july - timedelta(days=1)) == (before,)
    dearer = PriceBook([price("m", "2026-01-01", input="1", cache_read="0.1", output="2")])
    assert dearest_rates(dearer, deployment, july) == ((Decimal("1"), Decimal("2")),)
    assert dearest_rates(PriceBook(), deployment, july) == ()


def test_the_synchronous_take_is_all_or_nothing(engine: Engine) -> None:
    """``Leases.take_now``: a slice not held, a limit changed, or any one charge it cannot
    cover (two charges on one slice counted together) takes nothing, and says so."""
    tenants(engine, "acme")
    budget = _budget(engine, "tenant:acme", "1")
    leases = Leases(
        sessions=session_factory(engine),
        hold_ttl=timedelta(seconds=60),
        clock=lambda: datetime(2026, 12, 1, 12, tzinfo=UTC),
    )
    start, _ = budget.bounds(datetime(2026, 12, 1, 12, tzinfo=UTC))
    cent = spend.Charge(budget.id, "", start, budget.limit, Decimal("0.01"))
    assert not leases.take_now((cent,))  # no slice held yet
    assert leases.leases == {}

    async def held() -> None:
        assert await leases.take((cent,)) is None  # waits for its slice
        leases.give_back((cent,))

    asyncio.run(held())
    lease = leases.leases[cent.key]  # its amounts in lease units
    slice_ = lease.available
    assert from_units(slice_) >= Decimal("0.08")  # room for eight such requests at least

    assert leases.take_now((cent,)) and from_units(lease.used) == Decimal("0.01")
    lowered = cent.replace(limit=Decimal("0.5"))
    assert not leases.take_now((lowered,)) and from_units(lease.used) == Decimal("0.01")
    whole = cent.replace(amount=from_units(lease.available))
    assert not leases.take_now((cent, whole)) and from_units(lease.used) == Decimal("0.01")
    assert leases.take_now((whole,)) and lease.available == 0
    assert not leases.take_now((cent.replace(amount=Decimal(0)),))  # nothing left: not even free
