"""Aggregates shared by the billing API, the CLI and the dashboard.

Everything sums in SQL (exact: see ``Money``), so the statement a tenant downloads and the
figures the dashboard shows come from the same query and cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.orm import Session

from gateway.db.models import PriceRow, RequestRow, TenantRow
from pricing.cost import ZERO

COMPLETED = "completed"


def day_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    """[start 00:00 UTC, end+1 00:00 UTC): both days included."""
    return (
        datetime.combine(start, time(), tzinfo=UTC),
        datetime.combine(end + timedelta(days=1), time(), tzinfo=UTC),
    )


def _day(session: Session) -> ColumnElement[str]:
    """The UTC day of a request's start, as 'YYYY-MM-DD' on both databases."""
    if session.get_bind().dialect.name == "sqlite":
        return func.strftime("%Y-%m-%d", RequestRow.started_at)
    return func.to_char(RequestRow.started_at, "YYYY-MM-DD")


def completed_interactions() -> ColumnElement[int]:
    """Distinct interactions with a completed attempt (interaction ids are per tenant)."""
    key = RequestRow.tenant_id + ":" + RequestRow.interaction_id
    return func.count(func.distinct(case((RequestRow.status == COMPLETED, key))))


@dataclass(frozen=True, slots=True)
class LineItem:
    """Requests of one day × model × price entry."""

    day: str
    model: str
    price_id: str | None
    currency: str
    requests: int
    completed_interactions: int
    uncached_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    input_rate: Decimal | None
    cache_read_rate: Decimal | None
    cache_write_rate: Decimal | None
    output_rate: Decimal | None
    cost_uncached: Decimal
    cost_cache_read: Decimal
    cost_cache_write: Decimal
    cost_output: Decimal
    cost_total: Decimal


def statement_lines(session: Session, *, tenant_id: str, start: date, end: date) -> list[LineItem]:
    """A tenant's line items for the UTC days start..end (both included)."""
    lower, upper = day_bounds(start, end)
    day = _day(session).label("day")
    query = (
        select(
            day,
            RequestRow.model,
            RequestRow.price_id,
            PriceRow.currency,
            func.count(),
            completed_interactions(),
            func.sum(RequestRow.uncached_tokens),
            func.sum(RequestRow.cache_read_tokens),
            func.sum(RequestRow.cache_write_tokens),
            func.sum(RequestRow.output_tokens),
            PriceRow.input,
            PriceRow.cache_read,
            PriceRow.cache_write,
            PriceRow.output,
            func.sum(RequestRow.cost_uncached),
            func.sum(RequestRow.cost_cache_read),
            func.sum(RequestRow.cost_cache_write),
            func.sum(RequestRow.cost_output),
            func.sum(RequestRow.cost_total),
        )
        .outerjoin(PriceRow, PriceRow.id == RequestRow.price_id)
        .where(
            RequestRow.tenant_id == tenant_id,
            RequestRow.started_at >= lower,
            RequestRow.started_at < upper,
        )
        .group_by(
            day,
            RequestRow.model,
            RequestRow.price_id,
            PriceRow.currency,
            PriceRow.input,
            PriceRow.cache_read,
            PriceRow.cache_write,
            PriceRow.output,
        )
        .order_by(day, RequestRow.model, RequestRow.price_id)
    )
    return [
        LineItem(
            day=row[0],
            model=row[1],
            price_id=row[2],
            currency=row[3] or "USD",
            requests=row[4],
            completed_interactions=row[5],
            uncached_tokens=int(row[6]),
            cache_read_tokens=int(row[7]),
            cache_write_tokens=int(row[8]),
            output_tokens=int(row[9]),
            input_rate=row[10],
            cache_read_rate=row[11],
            cache_write_rate=row[12],
            output_rate=row[13],
            cost_uncached=row[14] or ZERO,
            cost_cache_read=row[15] or ZERO,
            cost_cache_write=row[16] or ZERO,
            cost_output=row[17] or ZERO,
            cost_total=row[18] or ZERO,
        )
        for row in session.execute(query)
    ]


def period_completed_interactions(
    session: Session, *, tenant_id: str | None, lower: datetime, upper: datetime
) -> int:
    """Completed interactions in a period, counted once even across days and models."""
    query = select(completed_interactions()).where(
        RequestRow.started_at >= lower, RequestRow.started_at < upper
    )
    if tenant_id is not None:
        query = query.where(RequestRow.tenant_id == tenant_id)
    return int(session.scalar(query) or 0)


def tenant_by_id(session: Session, tenant_id: str) -> TenantRow | None:
    return session.get(TenantRow, tenant_id)
