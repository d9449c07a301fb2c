"""Keyword-only create/read/update functions for tenants, keys and prices."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.auth import Principal, hash_key, new_key
from gateway.db.models import ApiKeyRow, PriceRow, TenantRow
from gateway.errors import InvalidRequest, NotFound
from pricing.book import Price, PriceBook, long_context_from, tiers_from


def _now() -> datetime:
    return datetime.now(UTC)


def create_tenant(session: Session, *, name: str, cache_group: str | None = None) -> TenantRow:
    if session.scalar(select(TenantRow).where(TenantRow.name == name)) is not None:
        raise InvalidRequest(f"tenant {name!r} already exists")
    tenant = TenantRow(
        id="ten_" + secrets.token_hex(8), name=name, cache_group=cache_group, created_at=_now()
    )
    session.add(tenant)
    return tenant


def get_tenant(session: Session, *, name: str) -> TenantRow:
    tenant = session.scalar(select(TenantRow).where(TenantRow.name == name))
    if tenant is None:
        raise NotFound(f"no tenant named {name!r}")
    return tenant


def set_cache_group(session: Session, *, name: str, cache_group: str | None) -> TenantRow:
    """Put a tenant into an explicit cache-sharing group (None: its own scope)."""
    tenant = get_tenant(session, name=name)
    tenant.cache_group = cache_group
    return tenant


@dataclass(frozen=True, slots=True)
class IssuedKey:
    id: str
    key: str
    tenant_id: str


def create_key(session: Session, *, tenant_name: str) -> IssuedKey:
    """Issue a key; the plain key exists only in the return value."""
    tenant = get_tenant(session, name=tenant_name)
    key = new_key()
    row = ApiKeyRow(
        id="key_" + secrets.token_hex(8),
        tenant_id=tenant.id,
        key_hash=hash_key(key),
        prefix=key[:10],
        created_at=_now(),
    )
    session.add(row)
    return IssuedKey(id=row.id, key=key, tenant_id=tenant.id)


def revoke_key(session: Session, *, key_id: str) -> ApiKeyRow:
    row = session.get(ApiKeyRow, key_id)
    if row is None:
        raise NotFound(f"no API key {key_id!r}")
    if row.revoked_at is None:
        row.revoked_at = _now()
    return row


def active_principals(session: Session) -> dict[str, Principal]:
    """Every active key hash with the principal it authenticates."""
    rows = session.execute(
        select(
            ApiKeyRow.key_hash, ApiKeyRow.id, TenantRow.id, TenantRow.name, TenantRow.cache_group
        )
        .join(TenantRow, TenantRow.id == ApiKeyRow.tenant_id)
        .where(ApiKeyRow.revoked_at.is_(None))
    )
    return {
        key_hash: Principal(
            tenant_id=tenant_id,
            tenant_name=name,
            api_key_id=key_id,
            cache_scope=f"group:{group}" if group else f"tenant:{tenant_id}",
        )
        for key_hash, key_id, tenant_id, name, group in rows
    }


def price_from_row(row: PriceRow) -> Price:
    """A stored price entry, with its long-context and tier rates."""
    variants = orjson.loads(row.variants) if row.variants else {}
    return Price(
        model=row.model,
        effective_from=row.effective_from,
        input=row.input,
        cache_read=row.cache_read,
        cache_write=row.cache_write,
        output=row.output,
        currency=row.currency,
        source=row.source,
        captured_on=row.captured_on,
        cache_write_1h=row.cache_write_1h,
        long_context=long_context_from(variants.get("long_context")),
        tiers=tiers_from(variants.get("tiers")),
    )


def _variants_json(price: Price) -> str | None:
    variants = price.variants()
    return None if variants is None else orjson.dumps(variants).decode()


def _same_rates(row: PriceRow, price: Price) -> bool:
    stored = price_from_row(row)
    return (stored.base, stored.long_context, stored.tiers, stored.currency) == (
        price.base,
        price.long_context,
        price.tiers,
        price.currency,
    )


@dataclass(frozen=True, slots=True)
class PriceSync:
    added: list[str]
    unchanged: list[str]


def add_prices(session: Session, *, prices: Iterable[Price]) -> PriceSync:
    """Insert dated entries; an existing entry with the same id must have the same rates.

    Entries are never edited: a price that changes gets a new ``effective_from``.
    """
    added: list[str] = []
    unchanged: list[str] = []
    for price in prices:
        row = session.get(PriceRow, price.id)
        if row is not None:
            if not _same_rates(row, price):
                raise InvalidRequest(
                    f"price {price.id} already exists with other rates; "
                    "add a new entry with a later effective_from instead"
                )
            unchanged.append(price.id)
            continue
        session.add(
            PriceRow(
                id=price.id,
                model=price.model,
                effective_from=price.effective_from,
                input=price.input,
                cache_read=price.cache_read,
                cache_write=price.cache_write,
                output=price.output,
                currency=price.currency,
                source=price.source,
                captured_on=price.captured_on,
                created_at=_now(),
                cache_write_1h=price.cache_write_1h,
                variants=_variants_json(price),
            )
        )
        session.flush()
        added.append(price.id)
    return PriceSync(added=added, unchanged=unchanged)


def price_book(session: Session) -> PriceBook:
    return PriceBook(price_from_row(row) for row in session.scalars(select(PriceRow)))
