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

from gateway.db.crud import price_from_row
from gateway.db.models import PriceRow, RequestRow, TenantRow
from pricing.book import STANDARD, Price, Rates
from pricing.cost import NANO, ZERO

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
    """Requests of one day × model × price entry × rate set (standard, long_context, a tier).

    The rates are those the line's costs were computed with; ``cost_cache_write`` covers
    both 5-minute and 1-hour writes (``cache_write_1h_tokens`` of them at the 1-hour rate).
    """

    day: str
    model: str
    price_id: str | None
    rate_class: str | None
    currency: str
    requests: int
    completed_interactions: int
    uncached_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int
    output_tokens: int
    input_rate: Decimal | None
    cache_read_rate: Decimal | None
    cache_write_rate: Decimal | None
    cache_write_1h_rate: Decimal | None
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
            RequestRow.rate_class,
            func.count(),
            completed_interactions(),
            func.sum(RequestRow.uncached_tokens),
            func.sum(RequestRow.cache_read_tokens),
            func.sum(RequestRow.cache_write_tokens),
            func.sum(RequestRow.cache_write_1h_tokens),
            func.sum(RequestRow.output_tokens),
            func.sum(RequestRow.cost_uncached),
            func.sum(RequestRow.cost_cache_read),
            func.sum(RequestRow.cost_cache_write),
            func.sum(RequestRow.cost_output),
            func.sum(RequestRow.cost_total),
        )
        .where(
            RequestRow.tenant_id == tenant_id,
            RequestRow.started_at >= lower,
            RequestRow.started_at < upper,
        )
        .group_by(day, RequestRow.model, RequestRow.price_id, RequestRow.rate_class)
        .order_by(day, RequestRow.model, RequestRow.price_id, RequestRow.rate_class)
    )
    rows = session.execute(query).all()
    prices = prices_by_id(session, {row[2] for row in rows if row[2] is not None})
    lines = []
    for row in rows:
        price = prices.get(row[2]) if row[2] is not None else None
        rates = _as_stored(price.rates_named(row[3] or STANDARD)) if price is not None else None
        lines.append(
            LineItem(
                day=row[0],
                model=row[1],
                price_id=row[2],
                rate_class=row[3],
                currency=price.currency if price is not None else "USD",
                requests=row[4],
                completed_interactions=row[5],
                uncached_tokens=int(row[6]),
                cache_read_tokens=int(row[7]),
                cache_write_tokens=int(row[8]),
                cache_write_1h_tokens=int(row[9]),
                output_tokens=int(row[10]),
                input_rate=rates.input if rates else None,
                cache_read_rate=rates.cache_read if rates else None,
                cache_write_rate=_or_input(rates.cache_write, rates) if rates else None,
                cache_write_1h_rate=(
                    _or_input(rates.cache_write_1h or rates.cache_write, rates) if rates else None
                ),
                output_rate=rates.output if rates else None,
                cost_uncached=row[11] or ZERO,
                cost_cache_read=row[12] or ZERO,
                cost_cache_write=row[13] or ZERO,
                cost_output=row[14] or ZERO,
                cost_total=row[15] or ZERO,
            )
        )
    return lines


def _as_stored(rates: Rates) -> Rates:
    """Every rate at the scale of the stored base rates (tier rates are kept as JSON text)."""
    scaled = {
        name: None if value is None else value.quantize(NANO)
        for name, value in (
            ("cache_write", rates.cache_write),
            ("cache_write_1h", rates.cache_write_1h),
        )
    }
    return Rates(
        input=rates.input.quantize(NANO),
        cache_read=rates.cache_read.quantize(NANO),
        output=rates.output.quantize(NANO),
        **scaled,
    )


def _or_input(rate: Decimal | None, rates: Rates) -> Decimal:
    """A write rate as applied: an entry without one bills writes as input (pricing.cost)."""
    return rate if rate is not None else rates.input


def prices_by_id(session: Session, ids: set[str]) -> dict[str, Price]:
    """Price entries (with their long-context and tier rates) by id."""
    if not ids:
        return {}
    rows = session.scalars(select(PriceRow).where(PriceRow.id.in_(ids)))
    return {row.id: price_from_row(row) for row in rows}


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
