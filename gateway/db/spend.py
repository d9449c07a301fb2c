"""Budgets and rate limits in the database: their rows, and the counters every gateway
process shares.

Exact under concurrency by construction: a reservation is one conditional UPDATE per
counter (``spent + reserved + amount <= limit``), which Postgres re-evaluates on the row
after taking its lock (and SQLite runs under its one writer), so two processes can never
both take the last of a budget. Counters of one request are charged in a fixed order (no
deadlock between two requests charging the same budgets).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Table, and_, delete, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import InstrumentedAttribute, Session

from gateway.budgets import (
    FOREVER,
    Budget,
    Period,
    RateLimit,
    Scope,
    ScopeKind,
    parse_alerts,
    parse_webhook,
    parse_zone,
)
from gateway.db import changes, crud
from gateway.db.models import (
    ApiKeyRow,
    BudgetAlertRow,
    BudgetCounterRow,
    BudgetHoldRow,
    BudgetRow,
    Money,
    RateLimitRow,
)
from gateway.errors import InvalidRequest, NotFound
from pricing.cost import divide_half_even

BUDGETS = "budgets"
LIMITS = "limits"
_Scoped = TypeVar("_Scoped", BudgetRow, RateLimitRow)


def _now() -> datetime:
    return datetime.now(UTC)


def _owner(session: Session, scope: Scope) -> tuple[str, str | None]:
    """The tenant id (and key id, for key scopes) a scope names; 404 if none."""
    if scope.kind is ScopeKind.KEY:
        key = None if "\x00" in scope.value else session.get(ApiKeyRow, scope.value)
        if key is None:
            raise NotFound(f"no API key with id {scope.value!r}")
        return key.tenant_id, key.id
    name = scope.tenant_name or ""
    tenant = crud.tenant_named(session, name)
    if tenant is None:
        raise NotFound(f"no tenant named {name!r}")
    return tenant.id, None


def _row_of_scope(
    session: Session,
    row_type: type[_Scoped],
    scope: Scope,
    *where: ColumnElement[bool],
    prefix: str,
    **values: Any,
) -> _Scoped:
    """The row set on ``scope`` (and matching ``where``), or a new one holding ``values``
    under a new id (``prefix`` + random hex); 404 if the scope's tenant or key is none."""
    tenant_id, key_id = _owner(session, scope)
    row = session.scalar(
        select(row_type).where(
            row_type.scope_kind == str(scope.kind), row_type.scope_value == scope.value, *where
        )
    )
    if row is None:
        row = row_type(
            id=prefix + secrets.token_hex(8),
            scope_kind=str(scope.kind),
            scope_value=scope.value,
            tenant_id=tenant_id,
            key_id=key_id,
            created_at=_now(),
            **values,
        )
        session.add(row)
    return row


def _delete(
    session: Session, row: _Scoped, topic: str, *references: InstrumentedAttribute[str]
) -> None:
    """Delete ``row`` and the rows whose ``references`` column names it; tell every gateway."""
    for column in references:
        session.execute(delete(column.class_).where(column == row.id))
    session.delete(row)
    changes.bump(session, topic)


def _get(session: Session, row_type: type[_Scoped], row_id: str, what: str) -> _Scoped:
    row = session.get(row_type, row_id)
    if row is None:
        raise NotFound(f"no {what} with id {row_id!r}")
    return row


def _scoped(row: BudgetRow | RateLimitRow) -> dict[str, Any]:
    """What a budget and a rate limit read alike from their rows' ``ScopedRow`` columns:
    the id, the scope, its tenant and (key scopes) its key."""
    return {
        "id": row.id,
        "scope": Scope(ScopeKind(row.scope_kind), row.scope_value),
        "tenant_id": row.tenant_id,
        "key_id": row.key_id,
    }


def _insert(session: Session, table: Any) -> Any:
    dialect = session.get_bind().dialect.name
    return (postgresql if dialect == "postgresql" else sqlite).insert(table)


# -- budgets ------------------------------------------------------------------------------


def budget_of(row: BudgetRow) -> Budget:
    """The budget a budget row holds."""
    return Budget(
        **_scoped(row),
        limit=row.limit,
        period=Period(row.period),
        timezone=row.timezone,
        alert_at=parse_alerts(row.alert_at) if row.alert_at else (),
        webhook=row.webhook,
    )


def set_budget(
    session: Session,
    *,
    scope: Scope,
    limit: Decimal,
    period: Period,
    timezone: str = "UTC",
    alert_at: tuple[Decimal, ...],
    webhook: str | None = None,
) -> Budget:
    """Create the budget of ``scope`` and ``period``, or change it if there is one."""
    parse_zone(timezone)
    webhook = parse_webhook(webhook)
    if len(alert_at) > 20:
        raise InvalidRequest("at most 20 alert thresholds", param="alert_at")
    row = _row_of_scope(
        session,
        BudgetRow,
        scope,
        BudgetRow.period == str(period),
        prefix="bud_",
        period=str(period),
    )
    row.limit, row.timezone, row.webhook = limit, timezone, webhook
    row.alert_at = ",".join(str(t) for t in alert_at)
    session.flush()
    changes.bump(session, BUDGETS)
    return budget_of(row)


def list_budgets(session: Session, *, tenant_id: str | None = None) -> list[Budget]:
    """Every budget (or one tenant's), oldest first."""
    query = select(BudgetRow).order_by(BudgetRow.created_at, BudgetRow.id)
    if tenant_id is not None:
        query = query.where(BudgetRow.tenant_id == tenant_id)
    return [budget_of(row) for row in session.scalars(query)]


def delete_budget(session: Session, *, budget_id: str) -> Budget:
    """Remove a budget and its counters; 404 if there is none."""
    row = _get(session, BudgetRow, budget_id, "budget")
    budget = budget_of(row)
    _delete(session, row, BUDGETS, BudgetCounterRow.budget_id, BudgetHoldRow.budget_id)
    return budget


def load_budgets(session: Session) -> tuple[int, tuple[Budget, ...]]:
    """The budgets' revision, and every budget (read after it: at least that new)."""
    return changes.revision(session, BUDGETS), tuple(list_budgets(session))


# Lease units: the integers the leases count in (``gateway/serving/leases.py``), so that
# admission adds and compares ints, not Decimals. A unit is 10^-11 of the prices'
# currency: money is to the nano (10^-9) and a limit x 5 % (a slice) to 10^-11, so every
# amount a lease holds is a whole number of units, exactly.
UNITS = 10**11
UNITS_PER_NANO = UNITS // 10**9
_ZERO = Decimal(0)


def to_units(amount: Decimal) -> int:
    """An amount in lease units: exact for any amount to 11 decimals (money, limits and
    their slices are), else rounded half-even to the unit."""
    numerator, denominator = amount.as_integer_ratio()
    return divide_half_even(numerator * UNITS, denominator)


def from_units(units: int) -> Decimal:
    """Lease units as an amount: to the nano where they are whole nanos (as ``money``
    gives them), else to the unit; 0 as ``Decimal(0)``."""
    if not units:
        return _ZERO
    nanos, rest = divmod(units, UNITS_PER_NANO)
    return Decimal(nanos).scaleb(-9) if not rest else Decimal(units).scaleb(-11)


class Charge:
    """An amount charged to one counter: a budget (or a rate limit's minute, named by
    ``window_counters``), its subject ('' or an interaction id) and the start of its
    period (and, where a lease should know it, its end).

    Never changed once made (compared and hashed on its six fields, as a frozen dataclass
    would be; ``replace`` makes a changed copy). The amount and the limit are also held in
    lease units (``units``, ``cap``), what the leases take; admission makes its charges
    from those alone (``amount`` None), and the amount is made from them only if asked
    (``from_units``: to the nano, as ``money`` gives it). A plain class with slots: admission
    makes one per budget for each request, and a dataclass's construction cost more.
    """

    __slots__ = (
        "_amount",
        "budget_id",
        "cap",
        "key",
        "limit",
        "period_end",
        "period_start",
        "subject",
        "units",
    )

    def __init__(
        self,
        budget_id: str,
        subject: str,
        period_start: datetime,
        limit: Decimal,
        amount: Decimal | None,
        period_end: datetime | None = None,
        units: int | None = None,
        cap: int | None = None,
    ) -> None:
        self.budget_id = budget_id
        self.subject = subject
        self.period_start = period_start
        self.limit = limit
        self.period_end = period_end
        # The counter charged: budget, subject and period start (made once: admission
        # looks every slice up by it).
        self.key: tuple[str, str, datetime] = (budget_id, subject, period_start)
        self._amount = amount
        if units is None:
            if amount is None:
                raise TypeError("a charge needs its amount or its units")
            units = to_units(amount)
        self.units: int = units
        self.cap: int = to_units(limit) if cap is None else cap

    @property
    def amount(self) -> Decimal:
        """The amount charged (made from ``units`` once, where it was not given)."""
        amount = self._amount
        if amount is None:
            amount = self._amount = from_units(self.units)
        return amount

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.budget_id,
            self.subject,
            self.period_start,
            self.limit,
            self.amount,
            self.period_end,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Charge)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Charge(budget_id={self.budget_id!r}, subject={self.subject!r}, "
            f"period_start={self.period_start!r}, limit={self.limit!r}, "
            f"amount={self.amount!r}, period_end={self.period_end!r})"
        )

    def replace(self, **changes: Any) -> Charge:
        """A copy with ``changes`` (as ``dataclasses.replace`` makes one)."""
        values: dict[str, Any] = {
            "budget_id": self.budget_id,
            "subject": self.subject,
            "period_start": self.period_start,
            "limit": self.limit,
            "amount": self.amount,
            "period_end": self.period_end,
        }
        values.update(changes)
        return Charge(**values)


def _counter(charge: Charge) -> Any:
    return and_(
        BudgetCounterRow.budget_id == charge.budget_id,
        BudgetCounterRow.subject == charge.subject,
        BudgetCounterRow.period_start == charge.period_start,
    )


def reserve(
    session: Session,
    charges: Sequence[Charge],
    *,
    holder: str = "",
    expires_at: datetime | None = None,
) -> Charge | None:
    """Reserve every charge, or none: the first that does not fit is returned (the caller
    rolls the transaction back). A charge fits while what is spent and reserved stays
    within the limit; a budget spent or reserved up to its limit (a zero one) takes none.
    With a ``holder`` (the request id), each reservation is a hold, swept at ``expires_at``
    if it is never settled.
    """
    ordered = sorted(charges, key=lambda c: c.key)
    if ordered:
        rows = [
            {"budget_id": c.budget_id, "subject": c.subject, "period_start": c.period_start}
            for c in ordered
        ]
        new = [{**r, "spent": Decimal(0), "reserved": Decimal(0)} for r in rows]
        session.execute(_insert(session, BudgetCounterRow).on_conflict_do_nothing(), new)
    for charge in ordered:
        amount = literal(charge.amount, Money())
        limit = literal(charge.limit, Money())
        held = BudgetCounterRow.spent + BudgetCounterRow.reserved
        taken = session.execute(
            update(BudgetCounterRow)
            .where(_counter(charge), held + amount <= limit, held < limit)
            .values(reserved=BudgetCounterRow.reserved + amount)
            .returning(BudgetCounterRow.budget_id)
        ).first()
        if taken is None:
            return charge
    if holder and ordered:
        holds = [
            {
                "request_id": holder,
                "budget_id": c.budget_id,
                "subject": c.subject,
                "period_start": c.period_start,
                "amount": c.amount,
                "expires_at": expires_at or FOREVER,
            }
            for c in ordered
        ]
        session.execute(_insert(session, BudgetHoldRow), holds)
    return None


def settle(
    session: Session, charges: Sequence[Charge], cost: Decimal, *, holder: str = ""
) -> list[tuple[Charge, Decimal]]:
    """Turn each reservation into the recorded ``cost``; each counter's spend after. A
    hold already swept (its gateway was thought gone) returned its amount then."""
    after: list[tuple[Charge, Decimal]] = []
    for charge in sorted(charges, key=lambda c: c.key):
        held = charge.amount
        if holder:
            released = session.scalar(
                delete(BudgetHoldRow)
                .where(
                    BudgetHoldRow.request_id == holder, BudgetHoldRow.budget_id == charge.budget_id
                )
                .returning(BudgetHoldRow.amount)
            )
            held = released if released is not None else Decimal(0)
        spent = session.scalar(
            update(BudgetCounterRow)
            .where(_counter(charge))
            .values(
                spent=BudgetCounterRow.spent + literal(cost, Money()),
                reserved=BudgetCounterRow.reserved - literal(held, Money()),
            )
            .returning(BudgetCounterRow.spent)
        )
        if spent is not None:  # None: the budget was deleted meanwhile
            after.append((charge, spent))
    return after


def renew(session: Session, holders: Sequence[str], expires_at: datetime) -> None:
    """Keep the holds of requests still running (``holders``) until ``expires_at``."""
    for start in range(0, len(holders), 1000):
        chunk = list(holders[start : start + 1000])
        session.execute(
            update(BudgetHoldRow)
            .where(BudgetHoldRow.request_id.in_(chunk))
            .values(expires_at=expires_at)
        )


def sweep(session: Session, now: datetime) -> int:
    """Return the amounts of holds expired by ``now`` (their gateway died); how many.
    Each hold is deleted by one sweeper only, so each amount is returned once."""
    expired = session.execute(
        delete(BudgetHoldRow)
        .where(BudgetHoldRow.expires_at < now)
        .returning(
            BudgetHoldRow.budget_id,
            BudgetHoldRow.subject,
            BudgetHoldRow.period_start,
            BudgetHoldRow.amount,
        )
    ).all()
    for budget_id, subject, period_start, amount in sorted(expired, key=lambda r: tuple(r)[:3]):
        session.execute(
            update(BudgetCounterRow)
            .where(
                BudgetCounterRow.budget_id == budget_id,
                BudgetCounterRow.subject == subject,
                BudgetCounterRow.period_start == period_start,
            )
            .values(reserved=BudgetCounterRow.reserved - literal(amount, Money()))
        )
    return len(expired)


def counter(
    session: Session, budget_id: str, period_start: datetime, subject: str = ""
) -> tuple[Decimal, Decimal]:
    """A counter's (spent, reserved); zeros before its first charge."""
    row = session.get(BudgetCounterRow, (budget_id, subject, period_start))
    return (row.spent, row.reserved) if row is not None else (Decimal(0), Decimal(0))


# -- alerts -------------------------------------------------------------------------------


def claim_alert(
    session: Session, charge: Charge, threshold: Decimal, spent: Decimal, status: str
) -> bool:
    """Claim the alert of one threshold in one period: True for the one caller that made
    it (whichever process), False for every other."""
    made = session.execute(
        _insert(session, BudgetAlertRow)
        .values(
            budget_id=charge.budget_id,
            subject=charge.subject,
            period_start=charge.period_start,
            threshold=str(threshold),
            spent=spent,
            created_at=_now(),
            status=status,
            attempts=0,
        )
        .on_conflict_do_nothing()
        .returning(BudgetAlertRow.budget_id)
    ).first()
    return made is not None


def mark_alert(
    session: Session,
    charge: Charge,
    threshold: Decimal,
    *,
    status: str,
    attempts: int,
    error: str | None = None,
) -> None:
    """Record how delivering an alert went."""
    session.execute(
        update(BudgetAlertRow)
        .where(
            BudgetAlertRow.budget_id == charge.budget_id,
            BudgetAlertRow.subject == charge.subject,
            BudgetAlertRow.period_start == charge.period_start,
            BudgetAlertRow.threshold == str(threshold),
        )
        .values(
            status=status,
            attempts=attempts,
            last_error=error,
            delivered_at=_now() if status == "delivered" else None,
        )
    )


def alerts(session: Session, *, budget_id: str) -> list[BudgetAlertRow]:
    """A budget's alerts, by period and threshold."""
    query = (
        select(BudgetAlertRow)
        .where(BudgetAlertRow.budget_id == budget_id)
        .order_by(BudgetAlertRow.period_start, BudgetAlertRow.threshold)
    )
    return list(session.scalars(query))


# -- rate limits --------------------------------------------------------------------------


def limit_of(row: RateLimitRow) -> RateLimit:
    """The rate limit a rate limit row holds."""
    return RateLimit(
        **_scoped(row),
        requests_per_minute=row.requests_per_minute,
        tokens_per_minute=row.tokens_per_minute,
    )


def set_limit(
    session: Session,
    *,
    scope: Scope,
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
) -> RateLimit:
    """Create or change the rate limit of a tenant or key."""
    if requests_per_minute is None and tokens_per_minute is None:
        raise InvalidRequest("give --requests-per-minute, --tokens-per-minute or both")
    for value, most in ((requests_per_minute, 10**9), (tokens_per_minute, 10**15)):
        if value is not None and not 0 <= value <= most:
            raise InvalidRequest(f"rate limits are from 0 to {most}")
    row = _row_of_scope(session, RateLimitRow, scope, prefix="rl_")
    row.requests_per_minute, row.tokens_per_minute = requests_per_minute, tokens_per_minute
    session.flush()
    changes.bump(session, LIMITS)
    return limit_of(row)


def list_limits(session: Session) -> list[RateLimit]:
    """Every rate limit, oldest first."""
    query = select(RateLimitRow).order_by(RateLimitRow.created_at, RateLimitRow.id)
    return [limit_of(row) for row in session.scalars(query)]


def delete_limit(session: Session, *, limit_id: str) -> RateLimit:
    """Delete the rate limit and its minutes' counters, telling every gateway; the limit
    as it was."""
    row = _get(session, RateLimitRow, limit_id, "rate limit")
    limit = limit_of(row)
    counters = window_counters(row.id)
    for table in (BudgetCounterRow, BudgetHoldRow):
        session.execute(delete(table).where(table.budget_id.in_(counters)))
    _delete(session, row, LIMITS)
    return limit


def load_limits(session: Session) -> tuple[int, tuple[RateLimit, ...]]:
    """The limits' revision, and every rate limit as of it."""
    return changes.revision(session, LIMITS), tuple(list_limits(session))


def window_counters(limit_id: str) -> tuple[str, str]:
    """The counters of a rate limit's minutes: its requests' and its tokens' (each a
    budget counter of that name per minute, held in leases like a budget's)."""
    return f"{limit_id}:requests", f"{limit_id}:tokens"


# -- leases -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseSync:
    """What one worker's lease on one counter should become: flush ``spent`` (settled
    here since the last sync) into the counter, then hold ``want`` unspent (at least what
    is in flight, ``floor``) if the limit allows."""

    holder: str
    budget_id: str
    subject: str
    period_start: datetime
    limit: Decimal
    spent: Decimal
    want: Decimal
    floor: Decimal
    expires_at: datetime


def sync_lease(session: Session, lease: LeaseSync) -> tuple[Decimal, Decimal]:
    """Flush a lease's spend and resize it, exactly; (what the worker holds now, unspent;
    the counter's spend after the flush).

    The counter's row is locked by the flush's UPDATE (Postgres; SQLite's one writer), so
    the room computed from it is the room there is: the spend and every worker's holds
    together never pass the limit. A lease swept meanwhile (its worker was thought dead)
    is taken again from what is free; a limit lowered below what is held takes back all
    that is not in flight.
    """
    counters: Table = BudgetCounterRow.__table__  # type: ignore[assignment]
    holds: Table = BudgetHoldRow.__table__  # type: ignore[assignment]
    # Core statements on the session's connection (the ORM's bulk-update path cost more
    # CPU than the statements: a busy worker runs this for each counter about once a second).
    connection = session.connection()
    key = (
        counters.c.budget_id == lease.budget_id,
        counters.c.subject == lease.subject,
        counters.c.period_start == lease.period_start,
    )
    new = {
        "budget_id": lease.budget_id,
        "subject": lease.subject,
        "period_start": lease.period_start,
        "spent": Decimal(0),
        "reserved": Decimal(0),
    }
    connection.execute(_insert(session, counters).on_conflict_do_nothing(), [new])
    # The hold as it was, taken away at once (put back below if anything stays held).
    before = connection.scalar(
        delete(holds)
        .where(holds.c.request_id == lease.holder, holds.c.budget_id == lease.budget_id)
        .returning(holds.c.amount)
    )
    held = before if before is not None else Decimal(0)
    flushed = min(lease.spent, held)
    spent, reserved = connection.execute(
        update(counters)
        .where(*key)
        .values(
            spent=counters.c.spent + literal(lease.spent, Money()),
            reserved=counters.c.reserved - literal(flushed, Money()),
        )
        .returning(counters.c.spent, counters.c.reserved)
    ).one()
    held -= flushed
    room = lease.limit - spent - reserved  # free for anyone; negative: the limit was lowered
    target = max(lease.want, lease.floor)
    change = min(target - held, max(room, Decimal(0))) if target > held else target - held
    if room < 0:
        change = min(change, max(room, lease.floor - held))
    if change:
        connection.execute(
            update(counters)
            .where(*key)
            .values(reserved=counters.c.reserved + literal(change, Money()))
        )
        held += change
    if held > 0:
        connection.execute(
            _insert(session, holds).values(
                request_id=lease.holder,
                budget_id=lease.budget_id,
                subject=lease.subject,
                period_start=lease.period_start,
                amount=held,
                expires_at=lease.expires_at,
            )
        )
    return held, spent
