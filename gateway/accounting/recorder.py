"""The recorder: records are journaled on the request path and written to the database
in batches off it, by a writer thread or a child process (``drainer.py``).

    request ──record()──▶ Journal (group commit) ──▶ response's last byte
                              │
    writer (thread|process) ◀─┘ tails segments ──▶ INSERT … ON CONFLICT DO NOTHING

The writer reads the journal, not memory, so normal operation, a database outage and
recovery after a crash are one code path; the request id makes every replay idempotent.
With ``otlp_endpoint`` the writer also makes and exports each written record's
OpenTelemetry span (``spans.py``), so a writer process keeps that work out of the
gateway's process too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

from gateway.accounting import drainer
from gateway.accounting.journal import Journal, JournalError, SyncMode
from gateway.accounting.records import Record
from gateway.accounting.store import insert_records
from gateway.db.session import DatabaseError, Engine
from gateway.errors import Unrecordable

log = logging.getLogger("kvgate.recorder")
# What the probe of a failed journal writes: room for a group of records, as a blank line
# the writer skips. A one-byte probe passes on a disk with a few bytes left, where records
# do not fit, and the gateway would flap between accepting and refusing.
PROBE_LINE = b" " * 4095


@dataclass(frozen=True, slots=True)
class RecorderStats:
    journaled: int
    written: int
    replayed: int
    db_errors: int
    journal_errors: int
    db_healthy: bool
    writer_ready: bool
    rejected: int
    spans_exported: int = 0
    spans_dropped: int = 0


class Recorder:
    """Makes records durable before responses finish, and gets them into the database.

    The database writer (``Drainer``) runs in a thread, or with ``database_url`` given and
    ``process=True`` in a child process, so its work never competes with the event loop.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        journal_dir: Path,
        sync: SyncMode = SyncMode.BACKGROUND,
        sync_interval_s: float = 0.01,
        batch_size: int = 500,
        flush_interval_s: float = 0.2,
        refuse_when_unrecordable: bool = True,
        database_url: str | None = None,
        process: bool = False,
        otlp_endpoint: str | None = None,
        otlp_export_interval_ms: float = 1000.0,
        writer_nice: int = 0,
    ) -> None:
        if process and database_url is None:
            raise ValueError("a recorder process needs the database URL")
        self.engine = engine
        self.journal = Journal(journal_dir, sync=sync, sync_interval_s=sync_interval_s)
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.refuse_when_unrecordable = refuse_when_unrecordable
        self.database_url = database_url
        self.process = process
        self.otlp_endpoint = otlp_endpoint  # OpenTelemetry spans, made by the writer
        self.otlp_export_interval_ms = otlp_export_interval_ms
        self.writer_nice = writer_nice  # the child process's niceness (a thread has none)
        self.journal_healthy = True
        self._journaled = 0
        self._journal_errors = 0
        self._spill: list[Record] = []
        self._spill_task: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        context = multiprocessing.get_context("spawn")
        if process:
            self._counters: MutableSequence[int] = context.Array("q", drainer.COUNTERS, lock=False)
            self._wake: drainer.EventLike = context.Event()
            self._stopping: drainer.EventLike = context.Event()
        else:
            self._counters = [0] * drainer.COUNTERS
            self._wake = threading.Event()
            self._stopping = threading.Event()
        self._worker: threading.Thread | BaseProcess | None = None

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
            self._journal_errors += 1
            self._journal_failed(exc)
            if self.refuse_when_unrecordable:
                raise Unrecordable("the record of this request could not be kept") from exc
            self._spill.append(record)
            if self._spill_task is None or self._spill_task.done():
                self._spill_task = asyncio.ensure_future(self._write_spill())
            return
        self._journaled += 1
        # Wake the writer early only for a full batch; otherwise it flushes on its interval.
        if self._journaled - self._counters[drainer.WRITTEN] >= self.batch_size:
            self._wake.set()

    @property
    def stats(self) -> RecorderStats:
        """The counters now, the writer's (shared with its process) included."""
        counters = self._counters
        return RecorderStats(
            journaled=self._journaled,
            written=counters[drainer.WRITTEN],
            replayed=counters[drainer.REPLAYED],
            db_errors=counters[drainer.DB_ERRORS],
            journal_errors=self._journal_errors,
            db_healthy=not counters[drainer.DB_DOWN],
            writer_ready=bool(counters[drainer.READY]),
            rejected=counters[drainer.REJECTED],
            spans_exported=counters[drainer.SPANS_EXPORTED],
            spans_dropped=counters[drainer.SPANS_DROPPED],
        )

    @property
    def backlog(self) -> int:
        """Records accepted but not yet in the database (this process's)."""
        written = self._counters[drainer.WRITTEN] - self._counters[drainer.REPLAYED]
        return max(self._journaled - written, 0) + len(self._spill)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Open the journal and start the writer: a spawned process, or a thread here."""
        self.journal.open()
        if self.process:
            assert self.database_url is not None
            self._worker = multiprocessing.get_context("spawn").Process(
                target=drainer.drain_in_process,
                name="kvgate-recorder",
                daemon=True,
                args=(
                    self.database_url,
                    str(self.journal.directory),
                    self.journal.prefix,
                    self.batch_size,
                    self.flush_interval_s,
                    self._counters,
                    self._wake,
                    self._stopping,
                    self.otlp_endpoint,
                    self.otlp_export_interval_ms,
                    self.writer_nice,
                ),
            )
        else:
            worker = drainer.Drainer(
                engine=self.engine,
                directory=self.journal.directory,
                own_prefix=self.journal.prefix,
                batch_size=self.batch_size,
                counters=self._counters,
                spans=drainer.spans_to(self.otlp_endpoint, self.otlp_export_interval_ms),
            )
            self._worker = threading.Thread(
                target=worker.run,
                args=(self._wake, self._stopping, self.flush_interval_s),
                name="kvgate-recorder",
                daemon=True,
            )
        self._worker.start()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Close the journal, then let the writer drain it (bounded); what is left is
        replayed at the next start."""
        for task in (self._probe, self._spill_task):
            if task is not None:
                task.cancel()
        self.journal.close()
        self._stopping.set()
        self._wake.set()
        if self._worker is not None:
            await asyncio.to_thread(self._worker.join, timeout_s)

    # -- when the journal fails ----------------------------------------------------------

    def _journal_failed(self, exc: OSError) -> None:
        if self.journal_healthy:
            log.error("journal unwritable: %s", exc)
        self.journal_healthy = False
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._probe_journal())

    async def _probe_journal(self) -> None:
        """Try the journal every second until it takes a group of records again."""
        while not self.journal_healthy:
            await asyncio.sleep(1.0)
            with contextlib.suppress(JournalError):
                await self.journal.append(PROBE_LINE)
                self.journal_healthy = True
                log.info("journal writable again")

    async def _write_spill(self) -> None:
        """Records the journal could not take (refusing disabled) go straight to the database."""
        while self._spill:
            batch = self._spill[: self.batch_size]
            try:
                await asyncio.to_thread(insert_records, self.engine, batch)
            except DatabaseError:
                await asyncio.sleep(1.0)
                continue
            del self._spill[: len(batch)]


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll a condition (for shutdown and tests)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
