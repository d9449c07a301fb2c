"""Price entries with variants survive the database exactly, on SQLite and Postgres."""

import pytest

from gateway.db import crud
from gateway.db.session import make_engine, session_factory, transaction
from gateway.errors import InvalidRequest
from pricing.book import price_from_mapping
from tests.providers.prices import ALL, GPT, SONNET


def test_variants_round_trip_and_re_adding_is_a_no_op(database_url: str) -> None:
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    with transaction(sessions) as session:
        assert len(crud.add_prices(session, prices=ALL).added) == len(ALL)
    with transaction(sessions) as session:
        again = crud.add_prices(session, prices=ALL)
        book = crud.price_book(session)
    engine.dispose()
    assert again.unchanged == [p.id for p in ALL]
    stored = book.price_for(SONNET.model, at=SONNET.effective_from)
    assert stored is not None
    assert (stored.base, stored.long_context, stored.tiers) == (
        SONNET.base,
        SONNET.long_context,
        SONNET.tiers,
    )
    gpt = book.price_for(GPT.model, at=GPT.effective_from)
    assert gpt is not None and gpt.tiers == GPT.tiers


def test_an_entry_cannot_change_its_variants(database_url: str) -> None:
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    with transaction(sessions) as session:
        crud.add_prices(session, prices=[GPT])
    changed = price_from_mapping(
        {
            "model": GPT.model,
            "effective_from": GPT.effective_from,
            "input": "2",
            "cache_read": "0.50",
            "output": "8",
            "tiers": {"priority": {"input": "4", "cache_read": "1", "output": "16"}},
        }
    )
    with (
        pytest.raises(InvalidRequest, match="already exists with other rates"),
        transaction(sessions) as session,
    ):
        crud.add_prices(session, prices=[changed])
    engine.dispose()
