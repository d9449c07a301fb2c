"""Keyword-only create/read/update functions for tenants, keys and prices.

Every change to what gateways hold in memory (keys and the tenants' scopes, prices) bumps
that kind's revision in the same transaction (db/changes.py): run such changes through
``changes.publish`` to return only once every gateway applies them.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from gateway.auth import Keys, Principal, hash_key, new_key
from gateway.db import changes
from gateway.db.models import ApiKeyRow, PriceRow, RequestRow, TenantRow
from gateway.errors import InvalidRequest, NotFound
from pricing.book import Price, PriceBook, long_context_from, tiers_from


def _now() -> datetime:
    return datetime.now(UTC)


def tenant_named(session: Session, name: str) -> TenantRow | None:
    """The tenant of this name, if any. No stored name holds a NUL (Postgres refuses one in
    text; ``create_tenant`` refuses control characters), so such a name finds none, asked
    of either database."""
    if "\x00" in name:
        return None
    return session.scalar(select(TenantRow).where(TenantRow.name == name))


MAX_NAME = 200  # a tenant's name and cache group: String(200) columns


def _checked(value: str, what: str) -> str:
    """A tenant's name or cache group as stored: 1 to MAX_NAME printable characters."""
    if not value or not value.isprintable() or len(value) > MAX_NAME:
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise InvalidRequest(f"{what} is 1 to {MAX_NAME} printable characters, not {shown!r}")
    return value


def create_tenant(session: Session, *, name: str, cache_group: str | None = None) -> TenantRow:
    """Add a tenant under a new id; InvalidRequest if its name is unprintable or taken."""
    _checked(name, "a tenant's name")
    if cache_group is not None:
        _checked(cache_group, "a cache group")
    if tenant_named(session, name) is not None:
        raise InvalidRequest(f"tenant {name!r} already exists")
    tenant = TenantRow(
        id="ten_" + secrets.token_hex(8), name=name, cache_group=cache_group, created_at=_now()
    )
    session.add(tenant)
    return tenant


def get_tenant(session: Session, *, name: str) -> TenantRow:
    """The tenant named ``name``; NotFound if there is none."""
    tenant = tenant_named(session, name)
    if tenant is None:
        raise NotFound(f"no tenant named {name!r}")
    return tenant


def set_cache_group(session: Session, *, name: str, cache_group: str | None) -> TenantRow:
    """Put a tenant into an explicit cache-sharing group (None: its own scope)."""
    tenant = get_tenant(session, name=name)
    tenant.cache_group = None if cache_group is None else _checked(cache_group, "a cache group")
    changes.bump(session, changes.KEYS)  # every key of the tenant now has another scope
    return tenant


def set_break_context(session: Session, *, name: str, capture: bool) -> int:
    """Keep (or stop keeping) the text around a tenant's prefix breaks; turning it off
    deletes what was kept. Returns how many kept contexts were deleted."""
    tenant = get_tenant(session, name=name)
    tenant.break_context = capture
    changes.bump(session, changes.KEYS)  # the tenant's keys now capture, or not
    if capture:
        return 0
    deleted: Any = session.execute(
        update(RequestRow)
        .where(RequestRow.tenant_id == tenant.id, RequestRow.break_context.is_not(None))
        .values(break_context=None)
        .execution_options(synchronize_session=False)
    )
    return int(deleted.rowcount or 0)


@dataclass(frozen=True, slots=True)
class IssuedKey:
    id: str
    key: str
    tenant_id: str
    tenant: str
    created_at: datetime


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
    changes.bump(session, changes.KEYS)
    return IssuedKey(
        id=row.id, key=key, tenant_id=tenant.id, tenant=tenant.name, created_at=row.created_at
    )


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A key as an operator sees it: never the key, nor its hash."""

    id: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None


def revoke_key(session: Session, *, key_id: str) -> KeyInfo:
    """Revoke a key (revoking it again changes nothing)."""
    row = None if "\x00" in key_id else session.get(ApiKeyRow, key_id)  # see tenant_named
    if row is None:
        raise NotFound(f"no API key {key_id!r}", code="key_not_found")
    if row.revoked_at is None:
        row.revoked_at = _now()
        changes.bump(session, changes.KEYS)
    tenant = session.get(TenantRow, row.tenant_id)
    return KeyInfo(
        id=row.id,
        tenant=tenant.name if tenant else row.tenant_id,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


def list_keys(session: Session, *, tenant_name: str | None = None) -> list[KeyInfo]:
    """Every key (of one tenant), oldest first."""
    query = select(ApiKeyRow.id, TenantRow.name, ApiKeyRow.created_at, ApiKeyRow.revoked_at).join(
        TenantRow, TenantRow.id == ApiKeyRow.tenant_id
    )
    if tenant_name is not None:
        query = query.where(TenantRow.id == get_tenant(session, name=tenant_name).id)
    rows = session.execute(query.order_by(ApiKeyRow.created_at, ApiKeyRow.id))
    return [KeyInfo(*row) for row in rows]


def active_keys(session: Session) -> tuple[int, Keys]:
    """The keys' revision, and every active key (read after it: at least that new)."""
    return changes.revision(session, changes.KEYS), active_principals(session)


def active_principals(session: Session) -> dict[str, Principal]:
    """Every active key hash with the principal it authenticates."""
    rows = session.execute(
        select(
            ApiKeyRow.key_hash,
            ApiKeyRow.id,
            TenantRow.id,
            TenantRow.name,
            TenantRow.cache_group,
            TenantRow.break_context,
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
            break_context=bool(capture),
        )
        for key_hash, key_id, tenant_id, name, group, capture in rows
    }


# What a price entry and its row hold alike, stored as they are (the row keeps the
# long-context and tier rates as JSON in ``variants``).
PRICE_COLUMNS = (
    "model",
    "effective_from",
    "input",
    "cache_read",
    "cache_write",
    "output",
    "currency",
    "source",
    "captured_on",
    "cache_write_1h",
)


def price_from_row(row: PriceRow) -> Price:
    """A stored price entry, with its long-context and tier rates."""
    variants = orjson.loads(row.variants) if row.variants else {}
    return Price(
        **{name: getattr(row, name) for name in PRICE_COLUMNS},
        long_context=long_context_from(variants.get("long_context")),
        tiers=tiers_from(variants.get("tiers")),
    )


def _variants_json(price: Price) -> str | None:
    variants = price.variants()
    return None if variants is None else orjson.dumps(variants).decode()


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
            if not price_from_row(row).charges_like(price):
                raise InvalidRequest(
                    f"price {price.id} already exists with other rates; "
                    "add a new entry with a later effective_from instead"
                )
            unchanged.append(price.id)
            continue
        session.add(
            PriceRow(
                id=price.id,
                **{name: getattr(price, name) for name in PRICE_COLUMNS},
                created_at=_now(),
                variants=_variants_json(price),
            )
        )
        session.flush()
        added.append(price.id)
    if added:
        changes.bump(session, changes.PRICES)
    return PriceSync(added=added, unchanged=unchanged)


def price_book(session: Session) -> PriceBook:
    """Every price entry in the database, as a price book."""
    return PriceBook(price_from_row(row) for row in session.scalars(select(PriceRow)))


def current_prices(session: Session) -> tuple[int, PriceBook]:
    """The prices' revision, and the book (read after it: at least that new)."""
    return changes.revision(session, changes.PRICES), price_book(session)


def records_since(session: Session, *, model: str, since: datetime) -> int:
    """Records of a price-book model (priced with one of its entries, or unpriced under
    its name) that started at or after ``since``."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(RequestRow)
            .where(RequestRow.started_at >= since)
            .where(
                or_(
                    RequestRow.price_id.startswith(f"{model}@", autoescape=True),
                    (RequestRow.price_id.is_(None)) & (RequestRow.model == model),
                )
            )
        )
        or 0
    )
