"""Look-ups the dashboard needs besides figures: names, spans, and single requests."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, func, select
from sqlalchemy.orm import Session

from gateway.db import sums
from gateway.db.models import ApiKeyRow, PriceRow, RequestRow, TenantRow, UsageHourRow
from gateway.db.sums import Sums


def tenant_names(session: Session, only: str | None = None) -> dict[str, str]:
    """Tenant id → name, by name (``only``: that tenant's alone, for a tenant's own view)."""
    query = select(TenantRow.id, TenantRow.name).order_by(TenantRow.name)
    if only is not None:
        query = query.where(TenantRow.id == only)
    return {tenant_id: name for tenant_id, name in session.execute(query)}


def models(session: Session, only: str | None = None) -> list[str]:
    """Every model that has requests (``only``: requests of that tenant)."""
    query = select(UsageHourRow.model).distinct().order_by(UsageHourRow.model)
    if only is not None:
        query = query.where(UsageHourRow.tenant_id == only)
    return list(session.scalars(query))


def traffic_span(session: Session, only: str | None = None) -> tuple[datetime, datetime] | None:
    """The first hour with requests and the end of the last one, or None without traffic
    (``only``: that tenant's requests)."""
    query = select(func.min(UsageHourRow.hour), func.max(UsageHourRow.hour))
    if only is not None:
        query = query.where(UsageHourRow.tenant_id == only)
    first, last = session.execute(query).one()
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


def attempts(
    session: Session, *, request_or_interaction_id: str, only: str | None = None
) -> list[RequestLine]:
    """Every attempt of the interaction a request id belongs to, or of an interaction id
    (``only``: of that tenant; another tenant's request or interaction is not found)."""
    key = request_or_interaction_id.strip()
    owned = select(RequestRow.tenant_id, RequestRow.interaction_id).where(
        RequestRow.request_id == key
    )
    if only is not None:
        owned = owned.where(RequestRow.tenant_id == only)
    owner = session.execute(owned).first()
    condition: ColumnElement[bool]
    if owner is not None:
        condition = (RequestRow.tenant_id == owner[0]) & (RequestRow.interaction_id == owner[1])
    else:
        condition = RequestRow.interaction_id == key
        if only is not None:
            condition = condition & (RequestRow.tenant_id == only)
    query = (
        select(*COLUMNS)
        .outerjoin(PriceRow, PriceRow.id == RequestRow.price_id)
        .where(condition)
        .order_by(
            RequestRow.tenant_id, RequestRow.started_at, RequestRow.attempt, RequestRow.request_id
        )
    )
    return _lines(session, query)


def key_holder(session: Session, key: str) -> tuple[str, str] | None:
    """The (key id, tenant id) of an active API key given in full, or None. Keys are
    stored as their SHA-256 hex digest (gateway/auth.py's hash_key), looked up by it."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    row = session.execute(
        select(ApiKeyRow.id, ApiKeyRow.tenant_id).where(
            ApiKeyRow.key_hash == digest, ApiKeyRow.revoked_at.is_(None)
        )
    ).first()
    return None if row is None else (row[0], row[1])


def key_active(session: Session, key_id: str) -> bool:
    """Whether the API key with id ``key_id`` exists and is not revoked."""
    row = session.execute(
        select(ApiKeyRow.id).where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None))
    ).first()
    return row is not None


def tenant_row(session: Session, tenant_id: str) -> TenantRow | None:
    """The tenant with id ``tenant_id``, or None."""
    return session.get(TenantRow, tenant_id)
