"""The keys and prices one gateway process serves with.

Loaded from the database at start; kept current by the change feed (db/feed.py), so a
key or price added, or a key revoked, applies to every request that starts after the
command or API call returned, on every worker and gateway sharing the database; reloaded
as a safety net every ``KVGATE_KEY_REFRESH_S`` / ``KVGATE_PRICE_REFRESH_S`` (for changes
made behind kvgate's back, with SQL); snapshotted locally each time a new copy is
installed. When the database cannot be reached at start, the gateway serves from that
snapshot: the keys it knew work, every record waits in the journal, and an unknown key
gets a 503 saying why. Once the database answers, everything is reloaded from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway.auth import KeyRing, Keys
from gateway.db import crud
from gateway.db.feed import Feed, make_feed
from gateway.db.session import DatabaseError, Engine, SessionFactory
from gateway.directory import snapshot
from gateway.mirror import UNLOADED, Mirror
from pricing.book import PriceBook

log = logging.getLogger("kvgate.directory")
# How long a start waits for the database (a host that drops packets would hold it for
# minutes), then for the change listener to catch up, before it serves anyway.
START_LOAD_S = 10.0
LISTENER_READY_S = 10.0


class Directory:
    """Keys and prices in memory, current, and snapshotted."""

    def __init__(
        self,
        *,
        engine: Engine,
        sessions: SessionFactory,
        journal_dir: Path,
        key_refresh_s: float,
        price_refresh_s: float,
    ) -> None:
        self._sessions = sessions
        self.feed: Feed = make_feed(engine)
        self.keys = KeyRing(self._load_keys, fresh=self.feed.check)
        self.prices: Mirror[PriceBook] = Mirror("prices", self._load_prices, PriceBook())
        self.snapshot_dir = snapshot.snapshot_directory(journal_dir)
        self.snapshots = snapshot.SnapshotWriter(self.snapshot_dir)
        self._intervals = {"keys": key_refresh_s, "prices": price_refresh_s}
        self._tasks: list[asyncio.Task[None]] = []
        self._saved: dict[str, object] = {}  # what the snapshots hold now
        self.started_from_snapshot = False

    def _load_keys(self) -> tuple[int, Keys]:
        with self._sessions() as session:
            return crud.active_keys(session)

    def _load_prices(self) -> tuple[int, PriceBook]:
        with self._sessions() as session:
            return crud.current_prices(session)

    @property
    def source(self) -> str:
        """Where the copies held came from: database, snapshot, or none (empty)."""
        if UNLOADED not in (self.keys.mirror.revision, self.prices.revision):
            return "database"
        return "snapshot" if self.started_from_snapshot else "none"

    async def start(self) -> None:
        """Load (or fall back on the snapshot), then follow the changes."""
        try:
            await asyncio.wait_for(self._load(), START_LOAD_S)
        except (DatabaseError, TimeoutError) as exc:
            # A load still running installs its copy when it returns (newer than a snapshot).
            self._from_snapshot(exc)
        self.keys.mirror.follow(self._save_keys)
        self.prices.follow(self._save_prices)
        self.snapshots.start()
        self.feed.watch(self.keys.mirror)
        self.feed.watch(self.prices)
        await self.feed.start()
        if self.source == "database" and not await self.feed.ready(LISTENER_READY_S):
            log.warning("the change listener is not connected yet: changes apply late")
        self._tasks = [
            asyncio.ensure_future(self._every("keys", lambda: self.keys.refresh(checked=True))),
            asyncio.ensure_future(
                self._every("prices", lambda: asyncio.to_thread(self.prices.reload_checked))
            ),
        ]

    async def _load(self) -> None:
        await self.keys.refresh()
        await asyncio.to_thread(self.prices.reload)

    def _from_snapshot(self, exc: Exception) -> None:
        found = snapshot.read_snapshot(self.snapshot_dir)
        if self.keys.mirror.revision == UNLOADED:
            self.keys.reachable = False
            if found.keys is not None:
                self.keys.mirror.install(UNLOADED, found.keys)
        if found.prices is not None and self.prices.revision == UNLOADED:
            self.prices.install(UNLOADED, found.prices)
        self.started_from_snapshot = found.keys is not None or found.prices is not None
        log.error(
            "database unreachable at start (%s): serving %d key(s) and %d price(s) from the "
            "snapshot under %s (keys saved %s, prices saved %s); records wait in the journal, "
            "unknown keys get a 503",
            type(exc).__name__,
            len(self.keys),
            len(self.prices.value),
            self.snapshot_dir,
            found.keys_saved_at or "never",
            found.prices_saved_at or "never",
        )

    def _save_keys(self, keys: Keys) -> None:
        # Never a snapshot written back to itself, nor the same copy again (each reload).
        if self.keys.mirror.revision == UNLOADED or self._saved.get(snapshot.KEYS) == keys:
            return
        self._saved[snapshot.KEYS] = keys
        self.snapshots.save(snapshot.KEYS, lambda: snapshot.keys_document(keys))

    def _save_prices(self, book: PriceBook) -> None:
        entries = book.entries()
        if self.prices.revision == UNLOADED or self._saved.get(snapshot.PRICES) == entries:
            return
        self._saved[snapshot.PRICES] = entries
        self.snapshots.save(snapshot.PRICES, lambda: [snapshot.price_document(p) for p in entries])

    async def _every(self, kind: str, refresh: Callable[[], Awaitable[object]]) -> None:
        """The safety-net reload; a failure is logged once until the next success."""
        failing = False
        while True:
            await asyncio.sleep(self._intervals[kind])
            try:
                await refresh()
            except DatabaseError as exc:
                if not failing:
                    log.warning("%s could not be reloaded (%s); retrying", kind, exc)
                failing = True
                continue
            if failing:
                log.info("%s reloaded from the database again", kind)
            failing = False

    async def stop(self) -> None:
        """Cancel the directory's tasks, then stop the change feed and the snapshot writer."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.feed.stop()
        await asyncio.to_thread(self.snapshots.stop)
