"""A gateway process's side of db/changes.py: its mirrors kept current as changes commit.

Postgres: a thread holds one autocommit connection that LISTENs on ``kvgate_changes``.
Each notification has the event loop reload that kind (in a thread), install it, and
confirm it (``NOTIFY kvgate_acks``), which is what a writer waits for. On every
(re)connection it reloads each kind whose revision moved and confirms them all, so a lost
connection loses no change. Nothing of this is on the request path.

SQLite: ``check()``, called as each request starts (its key check), reads ``PRAGMA
data_version`` on a connection of its own (shared memory, no I/O: about 1.5 µs on a quiet
core, benchmarks/directory.py). When that moved (any commit by another connection,
records included), it reads the revisions (one small query) and reloads, there and then,
every kind that changed: at most once per commit elsewhere, never once per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy import Engine, func, select, text

from gateway.db.changes import ACKS, CHANNEL, conninfo, listener_name
from gateway.mirror import Mirror

log = logging.getLogger("kvgate.changes")
RECONNECT_MAX_S = 5.0
LISTEN_POLL_S = 0.5  # how soon the listening thread sees that it should stop


class Feed(Protocol):
    """What the directory needs of a change feed, whatever the database."""

    def watch(self, mirror: Mirror[Any]) -> None:
        """Keep ``mirror`` current with the changes to its kind."""

    async def start(self) -> None:
        """Start following changes."""

    async def ready(self, timeout_s: float) -> bool:
        """Whether the feed has caught up with the database, waiting up to ``timeout_s``."""

    def check(self) -> None:
        """Reload, before a use, what changed since the last check (where nothing is pushed)."""

    async def stop(self) -> None:
        """Stop following changes."""

    @property
    def connected(self) -> bool:
        """Whether the feed has its database connection now."""


def make_feed(engine: Engine) -> Feed:
    """The change feed for the engine's database."""
    if engine.dialect.name == "postgresql":
        return PostgresFeed(engine)
    return SqliteFeed(engine)


class PostgresFeed:
    """LISTEN/NOTIFY: every change reloaded and confirmed as soon as it commits."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._mirrors: dict[str, Mirror[Any]] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._synced: asyncio.Event | None = None
        self._reloading: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._pid = 0  # the listening connection's backend pid: the writers' name for us
        self._connected = False

    @property
    def connected(self) -> bool:
        """Whether the listening connection is up now."""
        return self._connected

    def watch(self, mirror: Mirror[Any]) -> None:
        """Reload ``mirror`` whenever a change to its kind is notified."""
        self._mirrors[mirror.kind] = mirror

    async def start(self) -> None:
        """Start the listening thread; ``ready`` says when it has caught up."""
        self._loop = asyncio.get_running_loop()
        self._synced = asyncio.Event()
        self._thread = threading.Thread(target=self._listen, name="kvgate-changes", daemon=True)
        self._thread.start()

    async def ready(self, timeout_s: float) -> bool:
        """Whether the listener is connected and has caught up (within ``timeout_s``)."""
        assert self._synced is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._synced.wait(), timeout_s)
        return self._synced.is_set()

    def check(self) -> None:
        """Nothing to do: notifications arrive by themselves."""

    async def stop(self) -> None:
        """Stop the listening thread (waiting a little for it) and cancel reloads under way."""
        self._stopping.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, LISTEN_POLL_S * 4)
        for task in self._reloading.values():
            task.cancel()

    # -- the listening thread -------------------------------------------------------------

    def _listen(self) -> None:
        import psycopg

        backoff = 0.25
        while not self._stopping.is_set():
            try:
                with psycopg.connect(
                    conninfo(self._engine.url),
                    autocommit=True,
                    application_name=listener_name(self._mirrors),
                    connect_timeout=5,
                    # A gateway cut off without a word would otherwise wait for hours.
                    keepalives=1,
                    keepalives_idle=5,
                    keepalives_interval=2,
                    keepalives_count=3,
                ) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self._pid = connection.info.backend_pid
                    if not self._connected:
                        log.info("listening for changes (backend pid %d)", self._pid)
                    self._connected, backoff = True, 0.25
                    self._post(self._resync)
                    while not self._stopping.is_set():
                        for notify in connection.notifies(timeout=LISTEN_POLL_S):
                            self._post(functools.partial(self._changed, notify.payload))
            except psycopg.Error as exc:
                if self._connected:
                    log.warning("change notifications lost (%s); reconnecting", exc)
                self._connected = False
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
        self._connected = False

    def _post(self, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop has closed: we are stopping
            self._loop.call_soon_threadsafe(callback)

    # -- on the event loop ----------------------------------------------------------------

    def _resync(self) -> None:
        self._spawn("resync", self._resync_all())

    async def _resync_all(self) -> None:
        """After (re)connecting: reload what moved while we were not listening; confirm all."""
        try:
            revisions = await asyncio.to_thread(self._revisions)
        except Exception:
            log.exception("could not read the revisions; the next connection tries again")
            return
        current = []
        for kind, mirror in self._mirrors.items():
            if revisions.get(kind, 0) > mirror.revision:
                self._changed(kind)  # reloads, then confirms
            else:
                current.append((kind, mirror.revision))
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._confirm, current)
        assert self._synced is not None
        self._synced.set()

    def _changed(self, payload: str) -> None:
        kind = payload.split(" ", 1)[0]
        if kind not in self._mirrors:
            return
        running = self._reloading.get(kind)
        if running is not None and not running.done():
            self._again.add(kind)  # one more load after this one: it may predate the change
            return
        self._reloading[kind] = self._spawn(kind, self._reload(kind))

    async def _reload(self, kind: str) -> None:
        mirror = self._mirrors[kind]
        while True:
            self._again.discard(kind)
            try:
                revision = await asyncio.to_thread(mirror.reload)
                await asyncio.to_thread(self._confirm, [(kind, revision)])
            except Exception:
                log.exception("reloading %s failed; the periodic refresh will retry", kind)
            if kind not in self._again:
                return

    def _spawn(self, name: str, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        task.set_name(f"kvgate-changes-{name}")
        return task

    # -- database calls, in threads -------------------------------------------------------

    def _revisions(self) -> dict[str, int]:
        with self._engine.connect() as connection:
            rows = connection.execute(text("SELECT kind, revision FROM changes"))
            return {str(kind): int(revision) for kind, revision in rows}

    def _confirm(self, held: list[tuple[str, int]]) -> None:
        if not held:
            return
        with self._engine.connect() as connection:
            for kind, revision in held:
                payload = f"{self._pid} {kind} {revision}"
                connection.execute(select(func.pg_notify(ACKS, payload)))
            connection.commit()


class SqliteFeed:
    """``PRAGMA data_version`` before each use: a change applies from its commit on."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._mirrors: dict[str, Mirror[Any]] = {}
        self._raw: Any = None  # the pooled connection held for the checks
        self._connection: Any = None
        self._cursor: Any = None  # one, kept: a cursor per check is most of its cost
        self._version: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._down = False  # said once, not each second

    @property
    def connected(self) -> bool:
        """Whether the connection to the file is open now."""
        return self._connection is not None

    def watch(self, mirror: Mirror[Any]) -> None:
        """Reload ``mirror`` whenever a check finds its kind changed."""
        self._mirrors[mirror.kind] = mirror

    async def start(self) -> None:
        """Connect, and start the loop that reconnects and checks an idle process."""
        self._connect()
        self._task = asyncio.ensure_future(self._keep_checking())

    async def ready(self, timeout_s: float) -> bool:
        """Whether the connection is open: no wait, each check catches up by itself."""
        return self.connected

    def check(self) -> None:
        """Reload, here and now, each kind another connection changed since the last check."""
        cursor = self._cursor
        if cursor is None:
            return
        try:
            version = cursor.execute("PRAGMA data_version").fetchone()[0]
            if version == self._version:
                return
            rows = cursor.execute("SELECT kind, revision FROM changes").fetchall()
        except Exception as exc:  # the file went away, or is no database any more
            self._unreachable(exc)
            self._drop()
            return
        self._version = version
        for kind, revision in rows:
            mirror = self._mirrors.get(kind)
            if mirror is not None and revision > mirror.revision:
                try:
                    mirror.reload()
                except Exception:
                    log.exception("reloading %s failed; the next check retries", kind)
                    self._version = None

    async def stop(self) -> None:
        """Stop the checking loop and drop the connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._drop()

    async def _keep_checking(self) -> None:
        """Reconnect when the file was unreachable; check an idle process now and then."""
        while True:
            await asyncio.sleep(1.0)
            if self._connection is None:
                self._connect()
            self.check()

    def _connect(self) -> None:
        try:
            self._raw = self._engine.raw_connection()
        except Exception as exc:
            self._unreachable(exc)
            return
        if self._down:
            log.info("change checks resumed")
        self._down = False
        self._connection, self._version = self._raw.driver_connection, None
        self._cursor = self._connection.cursor()

    def _unreachable(self, exc: Exception) -> None:
        if not self._down:
            log.warning("change checks stopped (%s); retrying each second", exc)
        self._down = True

    def _drop(self) -> None:
        raw, self._raw, self._connection, self._cursor = self._raw, None, None, None
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.invalidate()
