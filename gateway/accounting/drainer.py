"""Moves journaled records into the database, in batches, off the request path.

A ``Drainer`` tails the segments of its own gateway process (up to the last complete line)
and replays whole the segments no live process holds (a crashed gateway's). It runs in a
thread, or in a child process of the gateway (``drain_in_process``), which keeps its
SQLAlchemy work off the event loop's core and GIL. Its counters live in a small array that
can be shared memory, so the gateway reads them for /metrics either way.

With OpenTelemetry on, each batch of its own records, once written, goes to ``spans.py``
too (the spans are made and exported there, in this process, never in the gateway's when
the writer is a process); replayed records make no span (see spans.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import signal
import sys
import time
from collections.abc import MutableSequence
from pathlib import Path
from typing import Any, Protocol

from gateway.accounting.journal import read_batch, segments
from gateway.accounting.records import Record
from gateway.accounting.spans import Spans
from gateway.accounting.store import insert_records
from gateway.db.session import REFUSED, DatabaseError, Engine

log = logging.getLogger("kvgate.recorder")

# Indices of the counters array; READY is 1 once the first pass over the journal is done.
WRITTEN, REPLAYED, DB_ERRORS, DB_DOWN, READY, REJECTED, SPANS_EXPORTED, SPANS_DROPPED = range(8)
COUNTERS = 8
# Records the database refuses for their data, kept for an operator (see Drainer._set_aside).
REJECTED_DIR = "rejected"
# How a database refuses one record's own data (not being down): ``REFUSED`` (db.session),
# integers past 64 bits included, which sqlite3 refuses before SQLAlchemy sees them.


class EventLike(Protocol):
    def set(self) -> None:
        """Set the flag, waking every waiter."""

    def clear(self) -> None:
        """Clear the flag."""

    def is_set(self) -> bool:
        """Whether the flag is set."""

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set or ``timeout`` passes; whether it is set."""


class Drainer:
    """One writer of journaled records into the database."""

    def __init__(
        self,
        *,
        engine: Engine,
        directory: Path,
        own_prefix: str,
        batch_size: int,
        counters: MutableSequence[int],
        spans: Spans | None = None,
    ) -> None:
        self.engine = engine
        self.directory = directory
        self.own_prefix = own_prefix
        self.batch_size = batch_size
        self.counters = counters
        self.spans = spans  # OpenTelemetry, when on: started and closed by run()
        self._offsets: dict[Path, int] = {}

    def run(
        self,
        wake: EventLike,
        stopping: EventLike,
        flush_interval_s: float,
        poll_s: float | None = None,
    ) -> None:
        """Drain until stopped; on stop, one final pass empties our own segments.

        ``poll_s`` caps each wait, for a stop that arrives as a flag rather than a wake-up.
        """
        if self.spans is not None:
            self.spans.start()
        try:
            self._run(wake, stopping, flush_interval_s, poll_s)
        finally:
            if self.spans is not None:
                self.spans.close()
                self._count_spans()

    def _run(
        self, wake: EventLike, stopping: EventLike, flush_interval_s: float, poll_s: float | None
    ) -> None:
        backoff, wait_s = 0.0, 0.0  # drain at once: a crashed gateway's journal first
        while True:
            stopping_now = stopping.is_set()
            _wait(wake, stopping, wait_s, poll_s)
            wake.clear()
            wait_s = flush_interval_s
            try:
                written = self.drain_once(final=stopping_now)
            except DatabaseError as exc:
                was_up = not self.counters[DB_DOWN]
                self.counters[DB_DOWN] = 1  # before the error count: readers see both
                self.counters[DB_ERRORS] += 1
                if was_up:
                    log.warning("database unavailable, records wait in the journal: %s", exc)
                backoff = min(max(backoff * 2, 0.25), 5.0)
                wait_s = max(backoff, flush_interval_s)
                if stopping_now:
                    return
                continue
            self._count_spans()
            if self.counters[DB_DOWN]:
                log.info("database back; journal backlog draining")
            self.counters[DB_DOWN] = 0
            self.counters[READY] = 1
            backoff = 0.0
            if stopping_now and not written:
                return
            # Go again at once only after a full batch (a backlog) or while stopping. A
            # part batch means the journal is drained: going again at once would chase its
            # tail, a transaction for every few records as they arrive (benchmarks/README.md
            # has what that cost the writer).
            if written >= self.batch_size or stopping_now:
                wake.set()

    def drain_once(self, *, final: bool = False) -> int:
        """Replay every orphan segment (whole), then write one batch from our own; how
        many records that wrote.

        Our newest segment may still be written to, so it is kept, unless ``final``.
        """
        listed = segments(self.directory)
        own = [p for p in listed if p.name.startswith(self.own_prefix)]
        current = max(own, key=lambda p: p.name) if own and not final else None
        written = sum(self._drain_orphan(p) for p in listed if p not in own)
        for path in own:
            batch = self._drain_own(path, keep=path == current)
            if batch:
                return written + batch
        return written

    def _drain_own(self, path: Path, *, keep: bool) -> int:
        offset = self._offsets.get(path, 0)
        lines, end = read_batch(path, offset, self.batch_size)
        if lines:
            records = self._write(lines)
            if self.spans is not None:
                self.spans.offer(records)
        self._offsets[path] = end
        if not keep and end >= _size(path):
            path.unlink(missing_ok=True)
            self._offsets.pop(path, None)
        return len(lines)

    def _drain_orphan(self, path: Path) -> int:
        """Replay a dead process's segment whole, holding its lock so no one else does."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
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
        self.counters[REPLAYED] += replayed
        if replayed:
            log.info("replayed %d records from %s", replayed, path.name)
        return replayed

    def _count_spans(self) -> None:
        if self.spans is not None:
            self.counters[SPANS_EXPORTED] = self.spans.exported
            self.counters[SPANS_DROPPED] = self.spans.dropped

    def _write(self, lines: list[bytes]) -> list[Record]:
        """Insert a batch of journal lines; the records they held."""
        records = []
        for line in lines:
            try:
                records.append(Record.from_json(line))
            except (ValueError, KeyError, TypeError):
                log.error("unreadable journal line skipped: %.200r", line)
        try:
            insert_records(self.engine, records)
        except REFUSED:
            self._write_each(records)
        self.counters[WRITTEN] += len(lines)
        return records

    def _write_each(self, records: list[Record]) -> None:
        """A batch refused for its data (not for the database being down): one record at a
        time, and the ones still refused set aside, so one bad record neither blocks the
        journal forever nor is lost."""
        for record in records:
            try:
                insert_records(self.engine, [record])
            except REFUSED as exc:
                self._set_aside(record, exc)

    def _set_aside(self, record: Record, exc: Exception) -> None:
        folder = self.directory / REJECTED_DIR
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{self.own_prefix}rejected.jsonl", "ab") as handle:
            handle.write(record.to_json() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.counters[REJECTED] += 1
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        log.error(
            "record %s refused by the database (%s); kept in %s/ for an operator",
            record.request_id,
            reason,
            folder,
        )


def _wait(wake: EventLike, stopping: EventLike, timeout_s: float, poll_s: float | None) -> None:
    """Wait for a wake-up or the timeout; with ``poll_s``, also notice a stop flag."""
    if poll_s is None:
        wake.wait(timeout_s)
        return
    deadline = time.monotonic() + timeout_s
    while not stopping.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0 or wake.wait(min(remaining, poll_s)):
            return


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


STOP_POLL_S = 0.2


class _Stop:
    """Asked to stop by the gateway (a multiprocessing Event) or by a signal (a flag).

    A signal handler must not set the Event: that takes the Event's lock, which the code
    the signal interrupted may hold (a self-deadlock, seen here). So the handler only sets
    a flag, and the drain loop polls for it.
    """

    def __init__(self, event: EventLike) -> None:
        self.event = event
        self.signalled = False

    def on_signal(self, *_: object) -> None:
        self.signalled = True

    def is_set(self) -> bool:
        return self.signalled or self.event.is_set()

    def set(self) -> None:
        self.event.set()

    def clear(self) -> None:
        self.event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        return self.signalled or self.event.wait(timeout)


def drain_in_process(
    database_url: str,
    directory: str,
    own_prefix: str,
    batch_size: int,
    flush_interval_s: float,
    counters: Any,
    wake: Any,
    stopping: Any,
    otlp_endpoint: str | None = None,
    otlp_export_interval_ms: float = 1000.0,
    nice: int = 0,
) -> None:
    """The child process's main: drain until the gateway asks it to stop, or dies."""
    from gateway.db.session import make_engine

    if nice:
        os.nice(nice)  # below the serving loop: a batch gives the core up to a request

    if sys.platform == "linux":  # be told when the gateway dies, even by SIGKILL
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    stop = _Stop(stopping)
    signal.signal(signal.SIGTERM, stop.on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the gateway's to handle
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    engine = make_engine(database_url)
    try:
        Drainer(
            engine=engine,
            directory=Path(directory),
            own_prefix=own_prefix,
            batch_size=batch_size,
            counters=counters,
            spans=spans_to(otlp_endpoint, otlp_export_interval_ms),
        ).run(wake, stop, flush_interval_s, poll_s=STOP_POLL_S)
    finally:
        with contextlib.suppress(Exception):
            engine.dispose()


def spans_to(endpoint: str | None, export_interval_ms: float) -> Spans | None:
    """The writer's span exporter, when OpenTelemetry is on (the SDK imported only then)."""
    return Spans(endpoint, export_interval_ms=export_interval_ms) if endpoint else None
