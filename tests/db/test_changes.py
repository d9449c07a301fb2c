"""Change revisions, announcements and confirmations (gateway/db/changes.py, db/feed.py):
a change applies to everything that starts after the writer returned."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import changes
from gateway.db.changes import ACKS, conninfo, listener_name
from gateway.db.feed import PostgresFeed, SqliteFeed
from gateway.db.session import make_engine, session_factory, transaction
from gateway.mirror import UNLOADED, Mirror


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    yield session_factory(engine)
    engine.dispose()


def postgres_only(sessions: sessionmaker[Session]) -> None:
    if sessions.kw["bind"].dialect.name != "postgresql":
        pytest.skip("LISTEN/NOTIFY: Postgres only")


def current(sessions: sessionmaker[Session], kind: str = changes.PRICES) -> int:
    with sessions() as session:
        return changes.revision(session, kind)


def test_a_revision_moves_only_when_its_change_commits(sessions: sessionmaker[Session]) -> None:
    assert current(sessions, changes.KEYS) == current(sessions, changes.PRICES) == 0
    with pytest.raises(RuntimeError), transaction(sessions) as session:
        changes.bump(session, changes.PRICES)
        raise RuntimeError("the change fails")
    assert current(sessions) == 0
    with transaction(sessions) as session:
        assert changes.bump(session, changes.PRICES) == 1
        assert changes.bump(session, changes.PRICES) == 2
        assert changes.bump(session, "budgets") == 1  # a kind no migration seeded
    with sessions() as session:
        assert changes.revisions(session) == {"keys": 0, "prices": 2, "budgets": 1}


class Loads:
    """What a mirror loads: the revision in the database (and how often it was asked)."""

    def __init__(self, sessions: sessionmaker[Session], kind: str = changes.PRICES) -> None:
        self.sessions, self.kind, self.count = sessions, kind, 0

    def __call__(self) -> tuple[int, int]:
        self.count += 1
        revision = current(self.sessions, self.kind)
        return revision, revision


def bump(sessions: sessionmaker[Session], kind: str = changes.PRICES) -> changes.Published:
    return changes.publish(sessions, lambda session: changes.bump(session, kind))[1]


async def test_sqlite_a_change_is_seen_by_the_next_check_and_only_once(
    sessions: sessionmaker[Session],
) -> None:
    engine = sessions.kw["bind"]
    if engine.dialect.name != "sqlite":
        pytest.skip("PRAGMA data_version: SQLite only")
    loads = Loads(sessions)
    mirror: Mirror[int] = Mirror(changes.PRICES, loads, 0)
    mirror.reload()
    feed = SqliteFeed(engine)
    feed.watch(mirror)
    await feed.start()
    try:
        feed.check()
        assert loads.count == 1  # nothing changed since the load
        published = bump(sessions)
        feed.check()  # the next use after the writer returned: current
        assert mirror.value == published.revisions["prices"] == 1 and loads.count == 2
        for _ in range(100):
            feed.check()
        assert loads.count == 2
        with transaction(sessions) as session:  # another commit (records, say): no reload
            session.execute(text("UPDATE changes SET changed_at = NULL WHERE kind = 'keys'"))
        feed.check()
        assert loads.count == 2
    finally:
        await feed.stop()


async def started(feed: PostgresFeed) -> None:
    await feed.start()
    assert await feed.ready(10)


async def test_postgres_the_writer_returns_once_every_listener_holds_the_change(
    sessions: sessionmaker[Session],
) -> None:
    postgres_only(sessions)
    engine = sessions.kw["bind"]
    feeds, mirrors = [], []
    for _ in range(3):
        mirror: Mirror[int] = Mirror(changes.PRICES, Loads(sessions), 0)
        mirror.reload()
        feed = PostgresFeed(engine)
        feed.watch(mirror)
        await started(feed)
        feeds.append(feed)
        mirrors.append(mirror)
    try:
        for expected in range(1, 6):
            published = await asyncio.to_thread(bump, sessions)
            # Exactly when the writer returns, not a moment later.
            assert [m.value for m in mirrors] == [expected] * 3
            assert (published.confirmed, published.unconfirmed) == (3, ())
        # A change of a kind nobody keeps waits for nobody.
        assert (await asyncio.to_thread(bump, sessions, "budgets")).confirmed == 0
    finally:
        for feed in feeds:
            await feed.stop()


async def test_postgres_a_lost_connection_loses_no_change(
    sessions: sessionmaker[Session],
) -> None:
    postgres_only(sessions)
    engine = sessions.kw["bind"]
    loads = Loads(sessions)
    mirror: Mirror[int] = Mirror(changes.PRICES, loads, 0)
    mirror.reload()
    feed = PostgresFeed(engine)
    feed.watch(mirror)
    await started(feed)
    try:
        with engine.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'kvgate-changes %' "
                    "AND datname = current_database()"
                )
            )
        published = await asyncio.to_thread(bump, sessions)  # while it reconnects
        deadline = time.monotonic() + 10
        while mirror.value != published.revisions["prices"]:
            assert time.monotonic() < deadline, "the change made while disconnected was lost"
            await asyncio.sleep(0.05)
        assert feed.connected
    finally:
        await feed.stop()


def listener(sessions: sessionmaker[Session], kinds: list[str]) -> psycopg.Connection[Any]:
    """A gateway's listening connection, as the writer sees it, that never confirms."""
    connection = psycopg.connect(
        conninfo(sessions.kw["bind"].url), autocommit=True, application_name=listener_name(kinds)
    )
    connection.execute("LISTEN kvgate_changes")
    return connection


def test_postgres_a_listener_that_does_not_confirm_is_named_after_the_timeout(
    sessions: sessionmaker[Session],
) -> None:
    postgres_only(sessions)
    silent = listener(sessions, ["keys", "prices"])
    try:
        started_at = time.monotonic()
        _, published = changes.publish(
            sessions, lambda s: changes.bump(s, changes.PRICES), timeout_s=0.5
        )
        assert 0.5 <= time.monotonic() - started_at < 3
        pid = silent.info.backend_pid
        assert published.confirmed == 0
        assert published.unconfirmed == (f"pid {pid} at 127.0.0.1",)
    finally:
        silent.close()


def test_postgres_a_listener_that_goes_away_is_not_waited_for(
    sessions: sessionmaker[Session],
) -> None:
    postgres_only(sessions)
    leaving = listener(sessions, ["prices"])
    threading.Timer(0.3, leaving.close).start()
    started_at = time.monotonic()
    _, published = changes.publish(sessions, lambda s: changes.bump(s, changes.PRICES))
    assert time.monotonic() - started_at < 2 and published.unconfirmed == ()


def test_postgres_a_stale_or_foreign_confirmation_does_not_count(
    sessions: sessionmaker[Session],
) -> None:
    postgres_only(sessions)
    slow = listener(sessions, ["prices"])
    pid = slow.info.backend_pid

    def confirm_wrongly_then_rightly() -> None:
        time.sleep(0.2)
        with psycopg.connect(conninfo(sessions.kw["bind"].url), autocommit=True) as other:
            for payload in (f"{pid} prices 0", f"{pid} keys 99", "garbage", f"{pid + 1} prices 9"):
                other.execute("SELECT pg_notify(%s, %s)", (ACKS, payload))
            time.sleep(0.3)
            other.execute("SELECT pg_notify(%s, %s)", (ACKS, f"{pid} prices 1"))

    helper = threading.Thread(target=confirm_wrongly_then_rightly)
    helper.start()
    try:
        started_at = time.monotonic()
        _, published = changes.publish(sessions, lambda s: changes.bump(s, changes.PRICES))
        assert time.monotonic() - started_at >= 0.5  # only the right one counted
        assert (published.confirmed, published.unconfirmed) == (1, ())
    finally:
        helper.join()
        slow.close()


def test_mirrors_start_unloaded() -> None:
    assert Mirror("k", lambda: (0, 0), 0).revision == UNLOADED
