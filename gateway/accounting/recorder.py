"""The recorder: records are journaled on the request path and written to the database
in batches by one thread off it.

    request ──record()──▶ Journal (group commit) ──▶ response's last byte
                              │
    writer thread ◀───────────┘ tails segments ──▶ INSERT … ON CONFLICT DO NOTHING

The writer reads the journal, not memory, so normal operation, a database outage and
recovery after a crash are one code path; the request id makes every replay idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.journal import Journal, JournalError, read_batch, segments
from gateway.accounting.records import Record
from gateway.db import rollups
from gateway.db.models import RequestRow
from gateway.errors import Unrecordable

log = logging.getLogger("kvgate.recorder")


def record_row(record: Record) -> dict[str, Any]:
    """The database row of a record."""
    usage, cost = record.usage, record.cost
    return {
        "request_id": record.request_id,
        "tenant_id": record.tenant_id,
        "api_key_id": record.api_key_id,
        "interaction_id": record.interaction_id,
        "attempt": record.attempt,
        "model": record.model,
        "deployment": record.deployment,
        "upstream": record.upstream,
        "policy": record.policy,
        "stream": record.stream,
        "started_at": record.started_at,
        "first_token_at": record.first_token_at,
        "ended_at": record.ended_at,
        "status": record.status.value,
        "finish_reason": record.finish_reason,
        "error": record.error,
        "uncached_tokens": usage.uncached_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "output_tokens": usage.output_tokens,
        "usage_source": usage.source.value,
        "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        "service_tier": record.extra.get("service_tier"),
        "predicted_cached_tokens": record.predicted_cached_tokens,
        "ceiling_cached_tokens": record.ceiling_cached_tokens,
        "price_id": record.price_id,
        "cost_uncached": cost.uncached,
        "cost_cache_read": cost.cache_read,
        "cost_cache_write": cost.cache_write,
        "cost_output": cost.output,
        "cost_total": cost.total,
        "cost_uncached_equivalent": cost.uncached_equivalent,
    }


def insert_records(engine: Engine, records: list[Record]) -> None:
    """Insert a batch; rows already present (same request id) are left as they are.

    The hourly rollups take only the rows this insert created (RETURNING), in the same
    transaction: a replayed record changes neither requests nor rollups.
    """
    if not records:
        return
    table = RequestRow.__table__
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    statement = (
        dialect.insert(table)
        .on_conflict_do_nothing(index_elements=["request_id"])
        .returning(table.c.request_id)
    )
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        rows.setdefault(record.request_id, record_row(record))
    with engine.begin() as connection:
        inserted = connection.execute(statement, list(rows.values())).scalars().all()
        rollups.add(connection, [rows[request_id] for request_id in inserted])


@dataclass
class RecorderStats:
    journaled: int = 0
    written: int = 0
    replayed: int = 0
    db_errors: int = 0
    journal_errors: int = 0
    db_healthy: bool = True


class Recorder:
    """Makes records durable before responses finish, and gets them into the database."""

    def __init__(
        self,
        *,
        engine: Engine,
        journal_dir: Path,
        sync: bool = True,
        batch_size: int = 500,
        flush_interval_s: float = 0.2,
        refuse_when_unrecordable: bool = True,
        on_written: Callable[[list[Record]], None] | None = None,
    ) -> None:
        self.engine = engine
        self.journal = Journal(journal_dir, sync=sync)
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.refuse_when_unrecordable = refuse_when_unrecordable
        self.on_written = on_written
        self.stats = RecorderStats()
        self.journal_healthy = True
        self._spill: list[Record] = []
        self._spill_lock = threading.Lock()
        self._offsets: dict[Path, int] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._probe: asyncio.Task[None] | None = None

    # -- the request path -------------------------------------------------------------

    def check_accepting(self) -> None:
        """Refuse a new request up front when its record could not be kept."""
        if not self.journal_healthy and self.refuse_when_unrecordable:
            raise Unrecordable("the gateway cannot record requests right now; retry shortly")

    async def record(self, record: Record) -> None:
        """Return once the record is durable in the journal."""
        try:
            await self.journal.append(record.to_json())
        except JournalError as exc:
            self.stats.journal_errors += 1
            self._journal_failed(exc)
            if self.refuse_when_unrecordable:
                raise Unrecordable("the record of this request could not be kept") from exc
            with self._spill_lock:
                self._spill.append(record)
        else:
            self.stats.journaled += 1
        # Wake the writer early only for a full batch; otherwise it flushes on its interval.
        if self.backlog >= self.batch_size:
            self._wake.set()

    @property
    def backlog(self) -> int:
        """Records accepted but not yet in the database (this process)."""
        return max(self.stats.journaled - self.stats.written, 0) + len(self._spill)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.journal.open()
        self._thread = threading.Thread(target=self._run, name="kvgate-recorder", daemon=True)
        self._thread.start()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Drain to the database (bounded), then close; what is left is replayed next start."""
        if self._probe is not None:
            self._probe.cancel()
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout_s)
        self.journal.close()
        path = self.journal.path
        if path is not None and self._offsets.get(path) == _size(path):
            path.unlink(missing_ok=True)

    # -- the writer thread -------------------------------------------------------------

    def _run(self) -> None:
        # Drain first: a previous process's journal is replayed as soon as we start.
        backoff, wait_s = 0.0, 0.0
        while True:
            stopping = self._stopping.is_set()
            self._wake.wait(wait_s)
            self._wake.clear()
            wait_s = self.flush_interval_s
            try:
                progressed = self._drain_once()
            except SQLAlchemyError as exc:
                self.stats.db_errors += 1
                if self.stats.db_healthy:
                    log.warning("database unavailable, records wait in the journal: %s", exc)
                self.stats.db_healthy = False
                backoff = min(max(backoff * 2, 0.25), 5.0)
                wait_s = max(backoff, self.flush_interval_s)
                if stopping:
                    return
                continue
            if not self.stats.db_healthy:
                log.info("database back; journal backlog draining")
            self.stats.db_healthy = True
            backoff = 0.0
            if stopping and not progressed:
                return
            if progressed:
                self._wake.set()

    def _drain_once(self) -> bool:
        """Write one batch from the spill, our segments or an orphan; True if any."""
        with self._spill_lock:
            spilled, self._spill = self._spill, []
        if spilled:
            try:
                insert_records(self.engine, spilled)
            except SQLAlchemyError:
                with self._spill_lock:
                    self._spill[:0] = spilled
                raise
            self.stats.written += len(spilled)
            return True
        for path in segments(self.journal.directory):
            if path.name.startswith(self.journal.prefix):
                if self._drain_own(path):
                    return True
            elif self._drain_orphan(path):
                return True
        return False

    def _drain_own(self, path: Path) -> bool:
        offset = self._offsets.get(path, 0)
        lines, end = read_batch(path, offset, self.batch_size)
        if lines:
            self._write(lines)
            self.stats.written += len(lines)
        self._offsets[path] = end
        if path != self.journal.path and end >= _size(path):
            path.unlink(missing_ok=True)
            self._offsets.pop(path, None)
        return bool(lines)

    def _drain_orphan(self, path: Path) -> bool:
        """Replay a dead process's segment whole, holding its lock so no one else does."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            offset, replayed = 0, 0
            while True:
                lines, offset = read_batch(path, offset, self.batch_size)
                if not lines:
                    break
                self._write(lines)
                replayed += len(lines)
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
        self.stats.replayed += replayed
        if replayed:
            log.info("replayed %d records from %s", replayed, path.name)
        return replayed > 0

    def _write(self, lines: list[bytes]) -> None:
        records = []
        for line in lines:
            try:
                records.append(Record.from_json(line))
            except (ValueError, KeyError, TypeError):
                log.error("unreadable journal line skipped: %.200r", line)
        insert_records(self.engine, records)
        if self.on_written is not None:
            self.on_written(records)

    # -- journal health ----------------------------------------------------------------

    def _journal_failed(self, exc: OSError) -> None:
        if self.journal_healthy:
            log.error("journal unwritable: %s", exc)
        self.journal_healthy = False
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._probe_journal())

    async def _probe_journal(self) -> None:
        """Try the journal every second until it takes writes again."""
        while not self.journal_healthy:
            await asyncio.sleep(1.0)
            with contextlib.suppress(JournalError):
                await self.journal.append(b"")
                self.journal_healthy = True
                log.info("journal writable again")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll a condition (for shutdown and tests)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
