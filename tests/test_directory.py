"""The directory in one process: snapshots written when the copies change, a start without
the database from them, and back to the database as soon as it answers."""

from __future__ import annotations

import asyncio
import socket
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import insert, update

from gateway import directory as directory_module
from gateway.auth import hash_key
from gateway.db import changes, crud
from gateway.db.migrate import upgrade
from gateway.db.models import ApiKeyRow, PriceRow
from gateway.db.session import make_engine, session_factory, transaction
from gateway.directory import Directory
from gateway.errors import AuthenticationFailed, KeysUnavailable
from pricing.book import load_catalog
from tests.conftest import _backends, new_database


def make(url: str, journal: Path, refresh_s: float = 3600) -> Directory:
    engine = make_engine(url)
    return Directory(
        engine=engine,
        sessions=session_factory(engine),
        journal_dir=journal,
        key_refresh_s=refresh_s,
        price_refresh_s=refresh_s,
    )


def seed(url: str) -> str:
    """A migrated database with the catalog's prices and one tenant's key; the key."""
    upgrade(url)
    engine = make_engine(url)
    with transaction(session_factory(engine)) as session:
        crud.add_prices(session, prices=load_catalog())
        crud.create_tenant(session, name="acme")
        key = crud.create_key(session, tenant_name="acme").key
    engine.dispose()
    return key


async def wait_for(predicate: object, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_a_start_without_the_database_serves_the_snapshot_then_the_database(
    tmp_path: Path,
) -> None:
    home = tmp_path / "db"
    home.mkdir()
    url = f"sqlite:///{home / 'kvgate.db'}"
    key = seed(url)
    first = make(url, tmp_path / "journal")
    await first.start()
    assert first.source == "database" and len(first.keys) == 1
    await first.stop()  # the snapshot is written by the time it stops

    home.rename(tmp_path / "away")
    second = make(url, tmp_path / "journal")
    await second.start()
    try:
        assert second.source == "snapshot"
        assert (await second.keys.authenticate(f"Bearer {key}")).tenant_name == "acme"
        assert len(second.prices.value) == len(load_catalog())
        with pytest.raises(KeysUnavailable):
            await second.keys.authenticate("Bearer kvg-never-seen")

        (tmp_path / "away").rename(home)
        await wait_for(lambda: second.source == "database")  # the change check reconnects
        with pytest.raises(AuthenticationFailed):
            await second.keys.authenticate("Bearer kvg-never-seen")
    finally:
        await second.stop()


async def test_a_database_that_never_answers_holds_a_start_for_a_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that accepts connections and says nothing (what a partition looks like)."""
    monkeypatch.setattr(directory_module, "START_LOAD_S", 0.5)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    directory = make(f"postgresql://kvgate@127.0.0.1:{port}/kvgate", tmp_path / "journal")
    try:
        started = time.monotonic()
        await directory.start()
        assert time.monotonic() - started < 5
        assert directory.source == "none" and len(directory.keys) == 0
        with pytest.raises(KeysUnavailable):
            await directory.keys.authenticate("Bearer kvg-anything")
    finally:
        silent.close()  # the loads stuck on it fail now, and their threads end
        await directory.stop()


async def test_snapshots_are_rewritten_when_the_copies_change_not_at_every_reload(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'kvgate.db'}"
    seed(url)
    directory = make(url, tmp_path / "journal", refresh_s=0.05)
    await directory.start()
    try:
        await wait_for(lambda: directory.snapshots.written == 2)
        await asyncio.sleep(0.5)  # ten periodic reloads of each, nothing changed
        assert directory.snapshots.written == 2
        engine = make_engine(url)
        _, published = changes.publish(
            session_factory(engine), lambda s: crud.create_key(s, tenant_name="acme")
        )
        engine.dispose()
        directory.feed.check()  # the next request's check
        assert directory.keys.mirror.revision == published.revisions["keys"]
        await wait_for(lambda: directory.snapshots.written == 3)
        document = (tmp_path / "journal" / "snapshot" / "keys.json").read_text()
        assert all(digest in document for digest in directory.keys.mirror.value)
        assert hash_key("kvg-x") not in document
    finally:
        await directory.stop()


@pytest.mark.parametrize("backend", _backends())
async def test_a_change_made_with_sql_behind_kvgates_back_applies_at_the_next_safety_net_reload(
    tmp_path: Path, backend: str
) -> None:
    """KVGATE_KEY_REFRESH_S / KVGATE_PRICE_REFRESH_S: a key revoked and a price added with
    plain SQL bump no revision, so the change feed never hears of them; the periodic
    reload still picks both up, within one interval."""
    with new_database(backend, tmp_path) as url:
        key = seed(url)
        directory = make(url, tmp_path / "journal", refresh_s=0.3)
        await directory.start()
        engine = make_engine(url)
        try:
            assert (await directory.keys.authenticate(f"Bearer {key}")).tenant_name == "acme"
            revision = directory.keys.mirror.revision
            with engine.begin() as connection:
                connection.execute(update(ApiKeyRow).values(revoked_at=datetime.now(UTC)))
                connection.execute(
                    insert(PriceRow).values(
                        id="behind-the-back@2026-01-01T00:00:00Z", model="behind-the-back",
                        effective_from=datetime(2026, 1, 1, tzinfo=UTC), input=Decimal("1.5"),
                        cache_read=Decimal("0.15"), output=Decimal("6"),
                        created_at=datetime.now(UTC),
                    )
                )  # fmt: skip
            directory.feed.check()  # what a request does: no revision moved, nothing reloads
            assert directory.keys.mirror.revision == revision
            assert (await directory.keys.authenticate(f"Bearer {key}")).tenant_name == "acme"
            assert directory.prices.value.price_for("behind-the-back", at=datetime.now(UTC)) is None

            deadline = time.monotonic() + 3  # ten intervals
            while True:
                try:
                    await directory.keys.authenticate(f"Bearer {key}")
                except AuthenticationFailed:
                    break
                assert time.monotonic() < deadline, "the revoked key still authenticates"
                await asyncio.sleep(0.02)
            await wait_for(
                lambda: (
                    directory.prices.value.price_for("behind-the-back", at=datetime.now(UTC))
                    is not None
                ),
                timeout_s=3,
            )
            price = directory.prices.value.price_for("behind-the-back", at=datetime.now(UTC))
            assert price is not None and price.input == Decimal("1.5")
            assert directory.keys.mirror.revision == revision  # still no revision: the reload
        finally:
            engine.dispose()
            await directory.stop()
