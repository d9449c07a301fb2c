"""An append-only local journal of records, with group commit.

Each gateway process appends to its own segment files, ``<dir>/<pid>-<token>-<n>.jsonl``
(the random token keeps names apart when PIDs repeat, as PID 1 does in containers), and
holds an exclusive ``flock`` on the segment it writes. A segment whose lock can be taken
belongs to no live process: its records are replayed into the database.

Durability, by ``sync`` mode (``KVGATE_JOURNAL_SYNC``):

- ``background`` (the default): ``append`` writes the line to the file at once, on the
  loop (into the page cache: microseconds), so a record survives any crash of the gateway
  process (SIGKILL, OOM kill). A thread ``fdatasync``s what was written at most every
  ``sync_interval_s`` (10 ms by default), so a machine crash can lose only the records of
  that last window, as with Postgres's ``synchronous_commit = off``; ``take_sync_lag``
  gives the measured window. Neither the response nor the loop waits for the disk, and a
  request costs the thread nothing: it is woken once per window, not once per record.
- ``always``: ``append`` returns once the record's group is written and ``fdatasync``ed:
  a record survives a machine crash too, at one flush on every response (its cost is
  in benchmarks/README.md). Records that arrive while a flush is in progress form the
  next group: one ``write`` and one flush per group, however many requests wait on it.
- ``never``: written at once, never synced by us (the kernel flushes in its own time).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import secrets
import threading
import time
from enum import StrEnum
from pathlib import Path

SEGMENT_SUFFIX = ".jsonl"


class JournalError(OSError):
    """The journal could not be written."""


class SyncMode(StrEnum):
    """When the journal flushes to the disk (see the module docstring)."""

    ALWAYS = "always"
    BACKGROUND = "background"
    NEVER = "never"


class Journal:
    """The writing side: appends lines durably, in groups."""

    def __init__(
        self,
        directory: Path,
        *,
        sync: SyncMode = SyncMode.BACKGROUND,
        sync_interval_s: float = 0.01,
        segment_bytes: int = 64 << 20,
    ) -> None:
        self.directory = directory
        self.sync = SyncMode(sync)
        self.sync_interval_s = sync_interval_s
        self.segment_bytes = segment_bytes
        self._sequence = 0
        self.prefix = f"{os.getpid()}-{secrets.token_hex(4)}-"
        self._fd = -1
        # Held while the file descriptor changes or is flushed, so the sync thread never
        # flushes a closed (or reused) descriptor.
        self._fd_lock = threading.Lock()
        self._size = 0
        self.path: Path | None = None
        self._buffer: list[bytes] = []
        self._group: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._syncer: _Syncer | None = None

    def open(self) -> None:
        """Create the directory, open a new segment, and start the syncer in background mode."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._rotate()
        if self.sync is SyncMode.BACKGROUND:
            self._syncer = _Syncer(self, self.sync_interval_s)
            self._syncer.start()

    def close(self) -> None:
        """Stop the syncer and close the segment (flushed first unless syncing is off)."""
        if self._syncer is not None:
            self._syncer.stop()
            self._syncer = None
        with self._fd_lock:
            self._close_fd()

    @property
    def size_bytes(self) -> int:
        """Bytes on disk in the directory's journal segments."""
        return sum(p.stat().st_size for p in segments(self.directory))

    def take_sync_lag(self) -> float:
        """The longest write-to-flush time since the last call (background mode), seconds."""
        return self._syncer.take_lag() if self._syncer is not None else 0.0

    async def append(self, line: bytes) -> None:
        """Add one line; returns once it is written (and synced, in ``always`` mode)."""
        if self.sync is SyncMode.ALWAYS:
            await self._append_group(line)
            return
        if self._syncer is not None and self._syncer.failure is not None:
            # Refused until a flush succeeds again (the recorder's probe keeps trying).
            await asyncio.to_thread(self._syncer.retry)
        try:
            self._write(line + b"\n")  # into the page cache: microseconds, so on the loop
        except OSError as exc:
            raise JournalError(exc.errno, f"journal write failed: {exc}") from exc
        if self._syncer is not None:
            self._syncer.written()

    async def _append_group(self, line: bytes) -> None:
        """``always`` mode: join the next group, and return once it is written and synced."""
        self._buffer.append(line + b"\n")
        if self._group is None:
            self._group = asyncio.get_running_loop().create_future()
        group = self._group
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        await group

    async def _flush(self) -> None:
        # Yield once so that every record produced in this loop iteration joins the group.
        await asyncio.sleep(0)
        while self._buffer:
            data, self._buffer = b"".join(self._buffer), []
            group, self._group = self._group, None
            assert group is not None
            try:
                # In a thread even for one record: a sync can take milliseconds when the
                # disk is busy (seen here), and the loop must keep serving.
                await asyncio.to_thread(self._write, data)
            except OSError as exc:
                if not group.done():
                    group.set_exception(JournalError(exc.errno, f"journal write failed: {exc}"))
                group.exception()  # retrieved here, so no "never retrieved" warning
                continue
            if not group.done():
                group.set_result(None)

    def _write(self, data: bytes) -> None:
        if self._size >= self.segment_bytes:
            self._rotate()
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            # A write cut short (disk full) left part of the group in the file. Take it
            # back: the next group would otherwise continue the torn line, and its first
            # record, reported durable, would be unreadable.
            os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        if self.sync is SyncMode.ALWAYS:
            os.fdatasync(self._fd)

    def _rotate(self) -> None:
        with self._fd_lock:
            self._close_fd()
            self._sequence += 1
            self.path = self.directory / f"{self.prefix}{self._sequence:06d}{SEGMENT_SUFFIX}"
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._size = os.fstat(self._fd).st_size

    def _close_fd(self) -> None:
        """Close the segment, flushing it first unless syncing is off (caller holds the lock)."""
        if self._fd < 0:
            return
        try:
            if self.sync is not SyncMode.NEVER:
                os.fdatasync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1

    def _sync_now(self) -> None:
        with self._fd_lock:
            if self._fd >= 0:
                os.fdatasync(self._fd)


class _Syncer:
    """The background mode's flusher: a thread that fdatasyncs what was written, at most
    once per ``interval_s``.

    The loop wakes it only when the journal goes from flushed to unflushed, so it is woken
    at most once a window however many records arrive, and an idle journal costs nothing.
    Each flush covers every write before it began. A failed flush stops the journal: each
    ``append`` flushes again first and raises while that fails, so the gateway refuses what
    it may not be able to keep, and resumes once the disk takes a flush again.
    """

    def __init__(self, journal: Journal, interval_s: float) -> None:
        self._journal = journal
        self._interval_s = interval_s
        self._pending = threading.Event()
        self._stopped = threading.Event()
        self._stopping = False
        self._oldest_unsynced: float | None = None
        self._max_lag = 0.0
        self.failure: JournalError | None = None
        self._thread = threading.Thread(target=self._run, name="kvgate-journal-sync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def written(self) -> None:
        """Called on the loop after each write: wakes the thread for the first write after a
        flush only (the thread takes ``_oldest_unsynced`` before it flushes, so a write it
        did not see as pending is one its flush covers)."""
        if self._oldest_unsynced is None:
            self._oldest_unsynced = time.monotonic()
            self._pending.set()

    def retry(self) -> None:
        """Flush once more after a failure: clears it, or raises it again."""
        try:
            self._journal._sync_now()
        except OSError as exc:
            self.failure = JournalError(exc.errno, f"journal flush failed: {exc}")
            raise self.failure from exc
        self.failure = None

    def take_lag(self) -> float:
        lag, self._max_lag = self._max_lag, 0.0
        return lag

    def stop(self) -> None:
        self._stopping = True
        self._stopped.set()
        self._pending.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._pending.wait()
            self._pending.clear()
            if self._stopping:
                return  # close() flushes the segment as it closes it
            oldest, self._oldest_unsynced = self._oldest_unsynced, None
            try:
                self._journal._sync_now()
            except OSError as exc:
                # Appends now flush again first (``retry``), and fail while this does.
                self.failure = JournalError(exc.errno, f"journal flush failed: {exc}")
            else:
                if oldest is not None:
                    self._max_lag = max(self._max_lag, time.monotonic() - oldest)
            # The window: writes meanwhile wait for the next flush, which covers them all.
            self._stopped.wait(self._interval_s)


def segments(directory: Path) -> list[Path]:
    """Segment files, oldest first (by creation order within a process, then by name)."""
    if not directory.exists():
        return []
    return sorted(directory.glob(f"*{SEGMENT_SUFFIX}"), key=lambda p: (p.stat().st_mtime, p.name))


def is_orphan(path: Path) -> bool:
    """True when no live process holds the segment's lock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the lock we may have taken
    return True


def read_batch(path: Path, offset: int, limit: int) -> tuple[list[bytes], int]:
    """Up to ``limit`` complete lines from ``offset``, and the offset after them.

    A torn last line (a write cut short by a crash) is not returned: its request never
    got its response, since the response waits for the write.
    """
    lines: list[bytes] = []
    with open(path, "rb") as handle:
        handle.seek(offset)
        while len(lines) < limit:
            line = handle.readline()
            if not line.endswith(b"\n"):
                break
            offset += len(line)
            if line.strip():
                lines.append(line.rstrip(b"\n"))
    return lines, offset
