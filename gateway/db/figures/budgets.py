"""Budgets as the dashboard shows them: each one's current period, what it spent and holds,
how fast it burns and when it runs out at that rate; and refusals over time.

Spend is the counters' settled spend (``budget_counters.spent``), which is the sum of the
records' costs charged in the period. The burn rate is spend per day over the period so
far: from the period's start, or from when the budget was set if that is later (a total
budget's period starts in 1970). The run-out moment is when what remains is spent at that
rate: none if that is not before the period resets (or nothing was spent), "exhausted"
once nothing remains. An interaction budget caps each interaction on its own counter, so
it has no one spend: it shows how many interactions it counted this period and the
largest spend among them.

Refusals are the ``refused`` records, split by what refused them: the gateway writes a
budget's refusal as "budget …" (a 402) and a rate limit's as "rate limit …" (a 429) in the
record's error, and keeps no other field for it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import ColumnElement, and_, case, func, literal, or_, select
from sqlalchemy.orm import Session

from gateway.budgets import FOREVER, ScopeKind
from gateway.db.figures.spend import Scope, bucketer
from gateway.db.models import BudgetCounterRow, BudgetRow, Money, RequestRow
from gateway.db.spend import budget_of

ZERO = Decimal(0)
DAY_US = 86_400_000_000
BUDGET, RATE_LIMIT = "budget", "rate limit"
REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class BudgetFigures:
    """One budget in its period holding ``at``. Spend figures are None on an interaction
    budget (each interaction has its own): ``interactions`` and ``largest`` stand instead."""

    id: str
    tenant_id: str
    scope: str  # "tenant:acme", as set
    kind: str  # tenant | key | interaction | user | tag
    period: str  # day | week | month | total
    timezone: str
    limit: Decimal
    period_start: datetime
    resets: datetime | None  # None: a total budget never resets
    spent: Decimal | None
    reserved: Decimal
    remaining: Decimal | None
    burn_per_day: Decimal | None  # None: no time has passed, or an interaction budget
    runs_out: datetime | None  # at the burn rate, before it resets; None: not
    interactions: int | None = None  # interaction budgets: counters this period
    largest: Decimal | None = None  # interaction budgets: the largest one's spend

    @property
    def exhausted(self) -> bool:
        """Nothing remains of the limit this period."""
        return self.remaining is not None and self.remaining <= 0


def burn(spent: Decimal, since: datetime, at: datetime) -> Decimal | None:
    """Spend per day from ``since`` to ``at``; None when no time has passed."""
    elapsed = (at - since) // timedelta(microseconds=1)
    return None if elapsed <= 0 else spent * DAY_US / elapsed


def run_out(
    remaining: Decimal, spent: Decimal, since: datetime, at: datetime, resets: datetime | None
) -> datetime | None:
    """When ``remaining`` is spent at the rate ``spent`` went since ``since``: None when
    nothing was spent, or not before the period resets."""
    elapsed = (at - since) // timedelta(microseconds=1)
    if spent <= 0 or remaining <= 0 or elapsed <= 0:
        return None
    micros = int(remaining * elapsed / spent)  # whole microseconds, rounded down
    if resets is None and micros > (FOREVER - at) // timedelta(microseconds=1):
        return None
    when = at + timedelta(microseconds=micros)
    return when if resets is None or when < resets else None


def budgets(
    session: Session, *, at: datetime, tenant_ids: Sequence[str] = ()
) -> list[BudgetFigures]:
    """Every budget of these tenants (all when none are named) in its period holding
    ``at``, oldest first."""
    query = select(BudgetRow).order_by(BudgetRow.created_at, BudgetRow.id)
    if tenant_ids:
        query = query.where(BudgetRow.tenant_id.in_(tuple(tenant_ids)))
    rows = list(session.scalars(query))
    starts = {row.id: budget_of(row).bounds(at) for row in rows}
    counters = _counters(session, {row.id: starts[row.id][0] for row in rows})
    found = []
    for row in rows:
        budget = budget_of(row)
        start, end = starts[row.id]
        resets = None if end >= FOREVER else end
        mine = counters.get(row.id, _Counted())
        each = budget.scope.kind is ScopeKind.INTERACTION  # no one spend: each its own
        since = max(start, row.created_at)
        remaining = max(budget.limit - mine.spent, ZERO)
        found.append(
            BudgetFigures(
                id=row.id,
                tenant_id=row.tenant_id,
                scope=str(budget.scope),
                kind=str(budget.scope.kind),
                period=str(budget.period),
                timezone=budget.timezone,
                limit=budget.limit,
                period_start=start,
                resets=resets,
                spent=None if each else mine.spent,
                reserved=mine.reserved,
                remaining=None if each else remaining,
                burn_per_day=None if each else burn(mine.spent, since, at),
                runs_out=None if each else run_out(remaining, mine.spent, since, at, resets),
                interactions=mine.interactions if each else None,
                largest=mine.largest if each else None,
            )
        )
    return found


@dataclass(frozen=True, slots=True)
class _Counted:
    """A budget's counters in one period: the budget's own (subject '') and the
    interactions'."""

    spent: Decimal = ZERO  # the budget's own counter
    reserved: Decimal = ZERO  # every counter's
    interactions: int = 0
    largest: Decimal | None = None


def _counters(session: Session, starts: dict[str, datetime]) -> dict[str, _Counted]:
    """Each budget's counters of the period starting at ``starts[id]``, summed in SQL."""
    own = BudgetCounterRow.subject == ""
    found: dict[str, _Counted] = {}
    ids = list(starts)
    for first in range(0, len(ids), 200):
        chunk = ids[first : first + 200]
        query = (
            select(
                BudgetCounterRow.budget_id,
                func.sum(case((own, BudgetCounterRow.spent), else_=literal(ZERO, Money()))),
                func.sum(BudgetCounterRow.reserved),
                func.count(case((~own, 1))),
                func.max(case((~own, BudgetCounterRow.spent))),
            )
            .where(
                or_(
                    *(
                        and_(
                            BudgetCounterRow.budget_id == budget_id,
                            BudgetCounterRow.period_start == starts[budget_id],
                        )
                        for budget_id in chunk
                    )
                )
            )
            .group_by(BudgetCounterRow.budget_id)
        )
        for budget_id, spent, reserved, interactions, largest in session.execute(query):
            found[budget_id] = _Counted(
                Decimal(spent), Decimal(reserved), int(interactions), largest
            )
    return found


@dataclass(frozen=True, slots=True)
class Refusals:
    """Refused requests in one time bucket, by what refused them."""

    budget: int = 0  # 402: a budget could not cover the request
    rate_limit: int = 0  # 429: a rate limit was reached

    @property
    def total(self) -> int:
        """Every refusal in the bucket."""
        return self.budget + self.rate_limit


def started_hour(session: Session) -> ColumnElement[str]:
    """The UTC hour a request started, as 'YYYY-MM-DD HH:00:00' on both databases."""
    if session.get_bind().dialect.name == "sqlite":
        return func.strftime("%Y-%m-%d %H:00:00", RequestRow.started_at)
    return func.to_char(func.timezone("UTC", RequestRow.started_at), "YYYY-MM-DD HH24:00:00")


def refusals(
    session: Session, scope: Scope, edges: Sequence[datetime]
) -> list[tuple[datetime, Refusals]]:
    """Refused requests per time bucket in the scope (``edges``: ascending whole UTC hours,
    n + 1 for n buckets), split budget vs rate limit; empty buckets are present."""
    hour = started_hour(session)
    reason = case((RequestRow.error.like(f"{RATE_LIMIT} %"), RATE_LIMIT), else_=BUDGET)
    conditions = [
        RequestRow.status == REFUSED,
        RequestRow.started_at >= scope.lower,
        RequestRow.started_at < scope.upper,
    ]
    if scope.tenant_ids:
        conditions.append(RequestRow.tenant_id.in_(scope.tenant_ids))
    if scope.models:
        conditions.append(RequestRow.model.in_(scope.models))
    query = (
        select(hour.label("hour"), reason.label("reason"), func.count().label("n"))
        .where(*conditions)
        .group_by(hour, reason)
    )
    bucket = bucketer(edges)
    counts: dict[datetime, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for text, why, n in session.execute(query):
        start = bucket(datetime.fromisoformat(str(text)).replace(tzinfo=UTC))
        if start is not None:
            counts[start][str(why)] += int(n)
    return [
        (start, Refusals(counts[start][BUDGET], counts[start][RATE_LIMIT]))
        if start in counts
        else (start, Refusals())
        for start in edges[:-1]
    ]
