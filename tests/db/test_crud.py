"""Tenants, hashed keys, and prices that are added but never edited."""

from decimal import Decimal

import pytest
from sqlalchemy import select

from gateway.auth import hash_key
from gateway.db import crud
from gateway.db.models import ApiKeyRow
from gateway.db.session import make_engine, session_factory, transaction
from gateway.errors import InvalidRequest, NotFound
from pricing.book import load_catalog, price_from_mapping


@pytest.fixture
def sessions(database_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(database_url)
    yield session_factory(engine)
    engine.dispose()


def test_keys_are_stored_hashed_and_authenticate_their_tenant(sessions) -> None:  # type: ignore[no-untyped-def]
    with transaction(sessions) as session:
        tenant = crud.create_tenant(session, name="acme")
        issued = crud.create_key(session, tenant_name="acme")
    with sessions() as session:
        row = session.scalar(select(ApiKeyRow))
        assert row is not None and row.key_hash == hash_key(issued.key)
        assert issued.key not in (row.key_hash, row.prefix, row.id)
        principals = crud.active_principals(session)
    principal = principals[hash_key(issued.key)]
    assert (principal.tenant_id, principal.tenant_name, principal.api_key_id) == (
        tenant.id,
        "acme",
        issued.id,
    )
    assert principal.cache_scope == f"tenant:{tenant.id}"


def test_revoked_keys_are_not_active(sessions) -> None:  # type: ignore[no-untyped-def]
    with transaction(sessions) as session:
        crud.create_tenant(session, name="acme")
        issued = crud.create_key(session, tenant_name="acme")
    with transaction(sessions) as session:
        crud.revoke_key(session, key_id=issued.id)
    with sessions() as session:
        assert crud.active_principals(session) == {}
    with pytest.raises(NotFound), transaction(sessions) as session:
        crud.revoke_key(session, key_id="key_missing")


def test_cache_group_puts_tenants_into_one_scope(sessions) -> None:  # type: ignore[no-untyped-def]
    with transaction(sessions) as session:
        crud.create_tenant(session, name="a")
        crud.create_tenant(session, name="b", cache_group="team")
        crud.create_key(session, tenant_name="a")
        crud.create_key(session, tenant_name="b")
        crud.set_cache_group(session, name="a", cache_group="team")
    with sessions() as session:
        scopes = {p.cache_scope for p in crud.active_principals(session).values()}
    assert scopes == {"group:team"}


def test_duplicate_tenant_and_unknown_tenant_are_clear_errors(sessions) -> None:  # type: ignore[no-untyped-def]
    with transaction(sessions) as session:
        crud.create_tenant(session, name="acme")
    with pytest.raises(InvalidRequest), transaction(sessions) as session:
        crud.create_tenant(session, name="acme")
    with pytest.raises(NotFound), transaction(sessions) as session:
        crud.create_key(session, tenant_name="nobody")


def test_price_sync_is_idempotent_and_exact(sessions) -> None:  # type: ignore[no-untyped-def]
    catalog = load_catalog()
    with transaction(sessions) as session:
        first = crud.add_prices(session, prices=catalog)
    with transaction(sessions) as session:
        second = crud.add_prices(session, prices=catalog)
    assert len(first.added) == len(catalog) and first.unchanged == []
    assert second.added == [] and len(second.unchanged) == len(catalog)
    with sessions() as session:
        book = crud.price_book(session)
    assert book.entries() == sorted(catalog, key=lambda p: (p.model, p.effective_from))
    assert book.entries("kvgate/demo-llama-8b")[1].cache_read == Decimal("0.015")


def test_a_price_is_never_edited_in_place(sessions) -> None:  # type: ignore[no-untyped-def]
    entry = {
        "model": "m",
        "effective_from": "2026-01-01",
        "input": "1",
        "cache_read": "0.1",
        "output": "2",
    }
    with transaction(sessions) as session:
        crud.add_prices(session, prices=[price_from_mapping(entry)])
    with pytest.raises(InvalidRequest, match="later effective_from"), transaction(sessions) as s:
        crud.add_prices(s, prices=[price_from_mapping({**entry, "input": "9"})])
