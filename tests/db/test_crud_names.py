"""Names and ids from clients that no row can hold (a NUL: Postgres refuses it in text) are
simply not found, on either database, never a database error."""

from __future__ import annotations

import pytest

from gateway.db import crud
from gateway.db.session import make_engine, session_factory, transaction
from gateway.errors import InvalidRequest, NotFound


def test_a_name_with_a_nul_is_not_found_and_cannot_be_made(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        with transaction(session_factory(engine)) as session:
            with pytest.raises(NotFound):
                crud.get_tenant(session, name="\x00R\x16")
            with pytest.raises(NotFound):
                crud.create_key(session, tenant_name="a\x00")
            with pytest.raises(NotFound):
                crud.revoke_key(session, key_id="key_\x00")
            with pytest.raises(InvalidRequest):
                crud.create_tenant(session, name="bad\x00name")
            assert crud.tenant_named(session, "nobody") is None
    finally:
        engine.dispose()
