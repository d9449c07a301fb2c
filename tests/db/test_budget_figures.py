"""The dashboard's budget figures (gateway/db/figures/budgets.py) on SQLite and Postgres.

Records are inserted and charged to the budgets they match as admission charges them
(``Rules.budgets_for``, then ``spend.reserve`` and ``spend.settle`` with each record's
cost), so each settled counter is what the gateway leaves; the expected spend is summed
again from the records, and burn rates and run-out moments are worked out by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gateway.accounting.records import Record, Status
from gateway.accounting.store import insert_records
from gateway.budgets import DEFAULT_ALERTS, Budget, Period, Rules, ScopeKind, parse_scope
from gateway.db import spend
from gateway.db.figures import budgets as figures
from gateway.db.figures.spend import Scope
from gateway.db.models import BudgetRow
from gateway.db.session import make_engine, session_factory, transaction
from gateway.usage import Usage
from tests.factories import JAN, JUL, record, tenants

D = Decimal
AT = datetime(2026, 7, 11, tzinfo=UTC)  # a Saturday: July's 11th day, the week of July 6


def on(day: int, hour: int = 10, month: int = 7) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


@dataclass
class Ledger:
    sessions: sessionmaker[Session]
    a: str
    b: str
    budgets: dict[str, Budget]
    records: list[Record]


def _set(
    sessions: sessionmaker[Session], scope: str, limit: str, period: Period, created: datetime
) -> Budget:
    with transaction(sessions) as session:
        budget = spend.set_budget(
            session,
            scope=parse_scope(scope),
            limit=D(limit),
            period=period,
            alert_at=DEFAULT_ALERTS,
        )
        session.execute(
            update(BudgetRow).where(BudgetRow.id == budget.id).values(created_at=created)
        )
    return budget


def _charge(sessions: sessionmaker[Session], rules: Rules, r: Record) -> None:
    """Reserve then settle the record's cost on every budget it matches, as admission does."""
    tags = tuple(sorted(r.tags.items()))
    charges = []
    for budget in rules.budgets_for(r.tenant_id, r.api_key_id, r.end_user, tags):
        start, _ = budget.bounds(r.started_at)
        subject = r.interaction_id if budget.scope.kind is ScopeKind.INTERACTION else ""
        charges.append(spend.Charge(budget.id, subject, start, budget.limit, r.cost.total))
    with transaction(sessions) as session:
        assert spend.reserve(session, charges) is None
        spend.settle(session, charges, r.cost.total)


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    made = tenants(engine, "acme", "bravo", prices=[JAN, JUL])
    a, b = made["acme"].id, made["bravo"].id
    june = datetime(2026, 6, 1, tzinfo=UTC)
    budgets = {
        "month": _set(sessions, "tenant:acme", "7.2", Period.MONTH, june),
        "alice": _set(sessions, "user:acme/alice", "1.5", Period.WEEK, june),
        "each": _set(sessions, "interaction:acme", "5", Period.TOTAL, june),
        # Set on Wednesday July 8: it has burnt for 3 days, not since Monday.
        "atlas": _set(sessions, "tag:acme/team=atlas", "3", Period.WEEK, on(8, 0)),
        "bravo": _set(sessions, "tenant:bravo", "100", Period.MONTH, june),
        "idle": _set(sessions, "key:" + made["acme"].key_id, "1", Period.DAY, june),
    }
    ten_million = Usage(10_000_000, 0, 0, 0)  # 1.5 at July's 0.15 per 1M input tokens
    records = [
        record("r0", tenant_id=a, usage=ten_million, started_at=on(30, month=6),
               interaction_id="i1", api_key_id="k_other", prices=JUL),
        record("r1", tenant_id=a, usage=ten_million, started_at=on(2),
               interaction_id="i1", api_key_id="k_other"),
        record("r2", tenant_id=a, usage=ten_million, started_at=on(9), interaction_id="i2",
               api_key_id="k_other", end_user="alice", tags={"team": "atlas"}),
        # 0.15 input + 0.45 output = 0.6
        record("r3", tenant_id=a, usage=Usage(1_000_000, 0, 0, 1_000_000), started_at=on(10),
               interaction_id="i2", api_key_id="k_other", tags={"team": "atlas"}),
        record("r4", tenant_id=b, usage=Usage(1_000_000, 0, 0, 0), started_at=on(5)),
    ]  # fmt: skip
    assert [r.cost.total for r in records] == [D("1.5"), D("1.5"), D("1.5"), D("0.6"), D("0.15")]
    insert_records(engine, records)
    rules = Rules(budgets=tuple(budgets.values()))
    for r in records:
        _charge(sessions, rules, r)
    # A request in flight holds 0.25 of the month: reserved, not spent.
    month = budgets["month"]
    held = spend.Charge(month.id, "", month.bounds(AT)[0], month.limit, D("0.25"))
    with transaction(sessions) as session:
        assert spend.reserve(session, [held]) is None
    yield Ledger(sessions, a, b, budgets, records)
    engine.dispose()


def _spent_in_period(ledger: Ledger, name: str) -> Decimal:
    """What the records matching a budget cost in its period holding AT, from the records."""
    budget = ledger.budgets[name]
    start, end = budget.bounds(AT)
    matching = Rules(budgets=(budget,))
    return sum(
        (
            r.cost.total
            for r in ledger.records
            if start <= r.started_at < end
            and matching.budgets_for(
                r.tenant_id, r.api_key_id, r.end_user, tuple(sorted(r.tags.items()))
            )
        ),
        D(0),
    )


def test_each_budget_shows_its_period_spend_burn_rate_and_run_out(ledger: Ledger) -> None:
    with ledger.sessions() as session:
        found = {f.id: f for f in figures.budgets(session, at=AT)}
    by = {name: found[b.id] for name, b in ledger.budgets.items()}
    month = by["month"]
    # June's 1.5 (r0) is June's: July holds r1, r2 and r3.
    assert month.spent == _spent_in_period(ledger, "month") == D("3.6")
    assert (month.scope, month.kind, month.period, month.limit) == (
        "tenant:acme",
        "tenant",
        "month",
        D("7.2"),
    )
    assert (month.period_start, month.resets) == (on(1, 0), datetime(2026, 8, 1, tzinfo=UTC))
    assert (month.reserved, month.remaining) == (D("0.25"), D("3.6"))
    # 3.6 over the 10 days since July 1 is 0.36 a day; the 3.6 left lasts 10 days more.
    assert month.burn_per_day == D("0.36")
    assert month.runs_out == datetime(2026, 7, 21, tzinfo=UTC)
    assert not month.exhausted

    alice = by["alice"]  # r2 alone, 1.5 of 1.5
    assert alice.spent == _spent_in_period(ledger, "alice") == D("1.5")
    assert alice.period_start == datetime(2026, 7, 6, tzinfo=UTC)
    assert (alice.remaining, alice.runs_out, alice.exhausted) == (D(0), None, True)

    atlas = by["atlas"]  # r2 + r3 = 2.1 over the 3 days since it was set: 0.7 a day
    assert atlas.spent == _spent_in_period(ledger, "atlas") == D("2.1")
    assert atlas.burn_per_day == D("0.7")
    # 0.9 left at 0.7 a day: 9/7 days = 111,085.714285... s after AT, before Monday's reset.
    assert atlas.runs_out == datetime(2026, 7, 12, 6, 51, 25, 714285, tzinfo=UTC)
    assert atlas.resets == datetime(2026, 7, 13, tzinfo=UTC)

    each = by["each"]  # i1: r0 + r1 = 3.0; i2: r2 + r3 = 2.1
    assert (each.spent, each.remaining, each.burn_per_day, each.runs_out) == (
        None,
        None,
        None,
        None,
    )
    assert (each.interactions, each.largest) == (2, D("3.0"))
    assert (each.period_start, each.resets) == (datetime(1970, 1, 1, tzinfo=UTC), None)

    bravo = by["bravo"]  # 0.15 over 10 days: 0.015 a day, 99.85 left lasts past August 1
    assert (bravo.spent, bravo.burn_per_day, bravo.runs_out) == (D("0.15"), D("0.015"), None)

    # No request on its key, and its day starts at AT: no time to burn in, nothing projected.
    idle = by["idle"]
    assert (idle.spent, idle.reserved, idle.remaining, idle.burn_per_day, idle.runs_out) == (
        D(0),
        D(0),
        D(1),
        None,
        None,
    )
    assert (idle.period_start, idle.resets) == (AT, AT + timedelta(days=1))


def test_only_the_tenants_in_view_are_shown(ledger: Ledger) -> None:
    with ledger.sessions() as session:
        acme = figures.budgets(session, at=AT, tenant_ids=(ledger.a,))
        bravo = figures.budgets(session, at=AT, tenant_ids=(ledger.b,))
    assert {f.tenant_id for f in acme} == {ledger.a} and len(acme) == 5
    assert [f.scope for f in bravo] == ["tenant:bravo"]


def test_the_run_out_moment_is_none_when_it_would_come_after_the_reset() -> None:
    since = datetime(2026, 7, 1, tzinfo=UTC)
    resets = datetime(2026, 8, 1, tzinfo=UTC)
    # 1 spent in 10 days: 2.1 left lasts 21 days, to August 1 (the reset itself): none.
    assert figures.run_out(D("2.1"), D(1), since, AT, resets) is None
    assert figures.run_out(D("2.0999"), D(1), since, AT, resets) is not None
    assert figures.run_out(D("5"), D(1), since, AT, None) == datetime(2026, 8, 30, tzinfo=UTC)
    assert figures.run_out(D("5"), D(0), since, AT, resets) is None
    assert figures.burn(D(1), AT, AT) is None


def refusal(n: int, tenant: str, at: datetime, error: str) -> Record:
    return record(
        f"ref_{n}",
        tenant_id=tenant,
        usage=Usage.missing(),
        prices=None,
        started_at=at,
        took=timedelta(0),
        status=Status.REFUSED,
        error=error,
    )


BUDGET = "budget bud_1 on tenant:acme (month) cannot cover this request: limit 7.2; it resets"
RATE = "rate limit of key:key_1 reached for this minute; retry in 17 s"


def test_refusals_are_counted_per_bucket_budget_apart_from_rate_limit(database_url: str) -> None:
    engine = make_engine(database_url)
    made = tenants(engine, "acme", "bravo")
    a, b = made["acme"].id, made["bravo"].id
    insert_records(
        engine,
        [
            refusal(1, a, on(2, 10), BUDGET),
            refusal(2, a, datetime(2026, 7, 2, 10, 59, 59, 999999, tzinfo=UTC), BUDGET),
            refusal(3, a, on(2, 11), RATE),
            refusal(4, a, on(3, 0), RATE),
            refusal(5, b, on(2, 10), BUDGET),  # another tenant's
            refusal(6, a, on(4, 0), BUDGET),  # after the scope
            record("ok", tenant_id=a, started_at=on(2, 10), error=None),  # not refused
        ],
    )
    edges = [on(2, 0), on(2, 11), on(3, 0), on(4, 0)]
    with session_factory(engine)() as session:
        counted = figures.refusals(session, Scope(on(2, 0), on(4, 0), (a,)), edges)
        everyone = figures.refusals(session, Scope(on(2, 0), on(4, 0)), edges)
    engine.dispose()
    assert counted == [
        (on(2, 0), figures.Refusals(budget=2, rate_limit=0)),
        (on(2, 11), figures.Refusals(budget=0, rate_limit=1)),
        (on(3, 0), figures.Refusals(budget=0, rate_limit=1)),
    ]
    assert [r.total for _, r in everyone] == [3, 1, 1]
