"""Statement queries: a tenant's line items and a period's completed interactions.

Everything sums in SQL (exact: see ``Money``) with the expressions of ``gateway.db.sums``,
the same the dashboard's figures use, so the statement a tenant downloads and the figures
the dashboard shows cannot disagree.

Statements read what the writer keeps: their lines from ``statement_lines``
(``rolled_lines``) and the period's completed interactions from the hourly cells
(``rolled_completed``), a few hundred rows for a month whatever the traffic. Lines split by
end user or tag come from the requests themselves (``statement_lines``), as does
``period_completed``: the same figures from the raw rows, which the tests hold the rollups
to.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, case, func, select, text
from sqlalchemy.orm import Session

from gateway.db import sums
from gateway.db.crud import price_from_row
from gateway.db.figures import spend
from gateway.db.models import PriceRow, RequestRow, StatementLineRow, TenantRow
from gateway.db.sums import Sums
from pricing.book import STANDARD, Price, Rates
from pricing.cost import NANO, write_rates

COMPLETED = "completed"
REQUESTS = RequestRow.__table__
LINES = StatementLineRow.__table__
# The order of a day's lines of one rate set (``gateway.usage.UsageSource``'s values).
SOURCES = ("reported", "estimated", "missing")


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


@dataclass(frozen=True, slots=True)
class Grouping:
    """Statement lines split further: by end user, or by the value of one tag."""

    tag: str | None = None  # None: by end user

    @property
    def name(self) -> str:
        """As ``group_by`` is written: ``end_user`` or ``tag:KEY``."""
        return "end_user" if self.tag is None else f"tag:{self.tag}"

    def column(self) -> ColumnElement[Any]:
        """The grouped value of each request; NULL where the request has none."""
        if self.tag is None:
            return RequestRow.end_user.expression
        column: ColumnElement[Any] = RequestRow.tags[self.tag].as_string()
        return column


@dataclass(frozen=True, slots=True)
class LineItem:
    """Requests of one day × model × endpoint × price entry × rate set × usage source.

    ``endpoint`` is the inference endpoint's path (None: recorded before kvgate kept it).

    The rate set is standard, long_context or a tier; the usage source says whether the
    tokens were reported by the upstream, estimated by kvgate (failed and cancelled streams),
    or missing (no usage at all: zero tokens, zero cost, still attempts). ``rates`` are
    exactly those the line's costs were computed with, write rates resolved as
    ``pricing.cost.write_rates`` applies them; ``cost_cache_write`` covers both 5-minute
    and 1-hour writes (``cache_write_1h_tokens`` of them at the 1-hour rate). A line
    without a price entry has no rates, no currency and no cost (its stored costs are 0).
    """

    day: str
    model: str
    endpoint: str | None
    price_id: str | None
    rate_class: str | None
    usage_source: str
    currency: str | None
    completed_interactions: int
    sums: Sums
    rates: Rates | None
    group: str | None = None  # the end user or tag value, when grouped (None: none given)

    @property
    def priced(self) -> bool:
        """Whether a price entry priced these requests."""
        return self.price_id is not None


def statement_lines(
    session: Session,
    *,
    tenant_id: str,
    start: date,
    end: date,
    grouping: Grouping | None = None,
) -> list[LineItem]:
    """A tenant's line items for the UTC days start..end (both included), split by
    ``grouping`` when given."""
    lower, upper = day_bounds(start, end)
    day = _day(session).label("day")
    key: tuple[ColumnElement[Any], ...] = (
        day,
        RequestRow.model.expression,
        RequestRow.endpoint.expression,
        RequestRow.price_id.expression,
        RequestRow.rate_class.expression,
    )
    if grouping is not None:
        key = (*key, grouping.column().label("line_group"))
    source = RequestRow.usage_source.label("usage_source")
    where = (
        RequestRow.tenant_id == tenant_id,
        RequestRow.started_at >= lower,
        RequestRow.started_at < upper,
    )
    # Sums by hash (no sort), then the completed interactions of each line apart: a
    # count(DISTINCT) in the same query made the database sort every row of the month.
    _hash_groups(session)
    rows = (
        session.execute(
            select(*key, source, *sums.columns(REQUESTS)).where(*where).group_by(*key, source)
        )
        .mappings()
        .all()
    )
    cells = (
        select(*key, source, RequestRow.interaction_id)
        .where(*where, RequestRow.status == COMPLETED)
        .group_by(*key, source, RequestRow.interaction_id)
        .subquery()
    )
    names = [c.name for c in cells.c if c.name != "interaction_id"]
    _hash_groups(session)
    completed = {
        tuple(row[:-1]): row[-1]
        for row in session.execute(
            select(*(cells.c[n] for n in names), func.count()).group_by(
                *(cells.c[n] for n in names)
            )
        )
    }
    return _items(
        session,
        [
            {
                **row,
                "completed_interactions": completed.get(tuple(row[n] for n in names), 0),
                "line_group": row["line_group"] if grouping is not None else None,
            }
            for row in rows
        ],
    )


def rolled_lines(session: Session, *, tenant_id: str, start: date, end: date) -> list[LineItem]:
    """A tenant's line items for the UTC days start..end (both included), from the lines
    the writer keeps (``gateway.db.writer.lines``): what ``statement_lines`` sums from the
    requests, without reading them."""
    rows = session.execute(
        select(LINES).where(
            LINES.c.tenant_id == tenant_id, LINES.c.day >= start, LINES.c.day <= end
        )
    ).mappings()
    return _items(
        session,
        [
            {
                **row,
                "day": row["day"].isoformat(),
                **{name: row[name] or None for name in ("endpoint", "price_id", "rate_class")},
                "line_group": None,
            }
            for row in rows
        ],
    )


def _items(session: Session, rows: list[dict[str, Any]]) -> list[LineItem]:
    """Line items of rows with a line's key, sums and completed interactions, their rates
    and currency from their price entries, in the statement's order."""
    prices = prices_by_id(session, {row["price_id"] for row in rows if row["price_id"] is not None})
    lines = []
    for row in rows:
        price = prices.get(row["price_id"]) if row["price_id"] is not None else None
        lines.append(
            LineItem(
                day=row["day"],
                model=row["model"],
                endpoint=row["endpoint"],
                price_id=row["price_id"],
                rate_class=row["rate_class"],
                usage_source=row["usage_source"],
                currency=price.currency if price is not None else None,
                completed_interactions=row["completed_interactions"],
                sums=sums.from_row(row),
                rates=(
                    applied_rates(price.rates_named(row["rate_class"] or STANDARD))
                    if price is not None
                    else None
                ),
                group=row["line_group"],
            )
        )
    # Sorted here, not in SQL: the databases order NULLs differently.
    lines.sort(
        key=lambda line: (
            line.day,
            line.model,
            line.endpoint or "",
            line.price_id or "",
            line.rate_class or "",
            line.group is not None,
            line.group or "",
            SOURCES.index(line.usage_source) if line.usage_source in SOURCES else len(SOURCES),
            line.usage_source,
        )
    )
    return lines


def _hash_groups(session: Session) -> None:
    """Postgres: group the next queries by hash, for this transaction. It expects about a
    group per row of the day expression (840,006 for 120 lines at 10,000,000 records) and
    so sorted every row of the month (5.7 s of the statement's 6.5 s at 10,000,000)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL enable_sort = off"))


def applied_rates(rates: Rates) -> Rates:
    """The rates as ``pricing.cost`` applies them (write rates resolved), at the stored scale.

    Base rates are stored at nine decimal places; long-context and tier rates are kept as
    exact text, shown at nine places too unless that would round them.
    """
    five_minute, one_hour = write_rates(rates)
    return Rates(
        input=_shown(rates.input),
        cache_read=_shown(rates.cache_read),
        output=_shown(rates.output),
        cache_write=_shown(five_minute),
        cache_write_1h=_shown(one_hour),
    )


def _shown(rate: Decimal) -> Decimal:
    scaled = rate.quantize(NANO)
    return scaled if scaled == rate else rate


def prices_by_id(session: Session, ids: set[str]) -> dict[str, Price]:
    """Price entries (with their long-context and tier rates) by id."""
    if not ids:
        return {}
    rows = session.scalars(select(PriceRow).where(PriceRow.id.in_(ids)))
    return {row.id: price_from_row(row) for row in rows}


@dataclass(frozen=True, slots=True)
class Completed:
    """A period's completed interactions, and those of them a priced attempt completed.

    An interaction counts as priced when at least one of its completed attempts in the
    period was covered by a price entry: cost per completed interaction divides the cost of
    priced attempts by these.
    """

    interactions: int = 0
    priced: int = 0

    @property
    def unpriced(self) -> int:
        """Completed interactions that no priced attempt completed."""
        return self.interactions - self.priced


def period_completed(
    session: Session, *, tenant_id: str | None, lower: datetime, upper: datetime
) -> Completed:
    """Completed interactions in a period, counted once even across days and models.

    Grouped by interaction (a hash), then counted: ``count(DISTINCT)`` sorted the period's
    every row."""
    priced = func.max(case((RequestRow.price_id.is_not(None), 1), else_=0))
    query = (
        select(RequestRow.tenant_id, RequestRow.interaction_id, priced.label("priced"))
        .where(
            RequestRow.started_at >= lower,
            RequestRow.started_at < upper,
            RequestRow.status == COMPLETED,
        )
        .group_by(RequestRow.tenant_id, RequestRow.interaction_id)
    )
    if tenant_id is not None:
        query = query.where(RequestRow.tenant_id == tenant_id)
    interactions = query.subquery()
    _hash_groups(session)
    completed, priced_ones = session.execute(
        select(func.count(), func.sum(interactions.c.priced))
    ).one()
    return Completed(int(completed or 0), int(priced_ones or 0))


def rolled_completed(
    session: Session, *, tenant_id: str, lower: datetime, upper: datetime
) -> Completed:
    """``period_completed`` for whole UTC hours, from the hourly rollups: the tenant's
    completed cells less the repeats of interactions completed in several
    (``gateway.db.figures.spend``, the dashboard's own count)."""
    return Completed(*spend.completed(session, spend.Scope(lower, upper, (tenant_id,))))


def tenant_by_id(session: Session, tenant_id: str) -> TenantRow | None:
    """The tenant with id ``tenant_id``, or None."""
    return session.get(TenantRow, tenant_id)
