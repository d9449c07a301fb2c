"""Look-ups the dashboard needs besides figures: names, spans, and single requests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, func, select
from sqlalchemy.orm import Session

from gateway.db import sums
from gateway.db.models import PriceRow, RequestRow, TenantRow, UsageHourRow
from gateway.db.sums import Sums


def tenant_names(session: Session) -> dict[str, str]:
    """Tenant id → name, by name."""
    rows = session.execute(select(TenantRow.id, TenantRow.name).order_by(TenantRow.name))
    return {tenant_id: name for tenant_id, name in rows}


def models(session: Session) -> list[str]:
    """Every model that has requests."""
    return list(session.scalars(select(UsageHourRow.model).distinct().order_by(UsageHourRow.model)))


def traffic_span(session: Session) -> tuple[datetime, datetime] | None:
    """The first hour with requests and the end of the last one, or None without traffic."""
    first, last = session.execute(
        select(func.min(UsageHourRow.hour), func.max(UsageHourRow.hour))
    ).one()
    if first is None or last is None:
        return None
    return first, last + timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class RequestLine:
    """One attempt as the requests page lists it; ``sums`` are its tokens and money."""

    request_id: str
    tenant_id: str
    interaction_id: str
    attempt: int
    model: str
    upstream: str
    started_at: datetime
    first_token_at: datetime | None
    ended_at: datetime
    status: str
    finish_reason: str | None
    error: str | None
    usage_source: str
    predicted_cached_tokens: int | None
    ceiling_cached_tokens: int | None
    price_id: str | None
    currency: str | None  # of the price entry; None when unpriced
    sums: Sums

    @property
    def priced(self) -> bool:
        """Whether a price entry priced this attempt."""
        return self.price_id is not None


ATTEMPT = [
    getattr(RequestRow, name)
    for name in RequestLine.__dataclass_fields__
    if name not in ("currency", "sums")
]
COLUMNS = [*ATTEMPT, PriceRow.currency, *sums.row_columns(RequestRow.__table__)]


def _lines(session: Session, query: Select[Any]) -> list[RequestLine]:
    named = [*(column.key for column in ATTEMPT), "currency"]
    return [
        RequestLine(**{name: row[name] for name in named}, sums=sums.from_row(row))
        for row in session.execute(query).mappings()
    ]


def recent_requests(
    session: Session,
    *,
    lower: datetime,
    upper: datetime,
    tenant_id: str | None = None,
    model: str | None = None,
    status: str | None = None,
    limit: int = 100,
) -> list[RequestLine]:
    """The latest attempts started in [lower, upper), newest first, optionally filtered."""
    query = (
        select(*COLUMNS)
        .outerjoin(PriceRow, PriceRow.id == RequestRow.price_id)
        .where(RequestRow.started_at >= lower, RequestRow.started_at < upper)
        .order_by(RequestRow.started_at.desc(), RequestRow.request_id.desc())
        .limit(limit)
    )
    if tenant_id is not None:
        query = query.where(RequestRow.tenant_id == tenant_id)
    if model is not None:
        query = query.where(RequestRow.model == model)
    if status is not None:
        query = query.where(RequestRow.status == status)
    return _lines(session, query)


def attempts(session: Session, *, request_or_interaction_id: str) -> list[RequestLine]:
    """Every attempt of the interaction a request id belongs to, or of an interaction id."""
    key = request_or_interaction_id.strip()
    owner = session.execute(
        select(RequestRow.tenant_id, RequestRow.interaction_id).where(RequestRow.request_id == key)
    ).first()
    condition: ColumnElement[bool]
    if owner is not None:
        condition = (RequestRow.tenant_id == owner[0]) & (RequestRow.interaction_id == owner[1])
    else:
        condition = RequestRow.interaction_id == key
    query = (
        select(*COLUMNS)
        .outerjoin(PriceRow, PriceRow.id == RequestRow.price_id)
        .where(condition)
        .order_by(
            RequestRow.tenant_id, RequestRow.started_at, RequestRow.attempt, RequestRow.request_id
        )
    )
    return _lines(session, query)


def tenant_row(session: Session, tenant_id: str) -> TenantRow | None:
    """The tenant with id ``tenant_id``, or None."""
    return session.get(TenantRow, tenant_id)
