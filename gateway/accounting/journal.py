"""An append-only local journal of records, with group commit.

Each gateway process appends to its own segment files, ``<dir>/<pid>-<token>-<n>.jsonl``
(the random token keeps names apart when PIDs repeat, as PID 1 does in containers), and
holds an exclusive ``flock`` on the segment it writes. Records that arrive while a write is
in progress form the next group: one ``write`` (and one ``fdatasync`` when ``sync`` is on)
per group, however many requests are waiting on it. A segment whose lock can be taken
belongs to no live process: its records are replayed into the database.

Durability: with ``sync`` on, a record survives a machine crash once ``append`` returns;
with it off (``KVGATE_JOURNAL_SYNC=false``), it survives a crash of the process but
not of the machine.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import secrets
from pathlib import Path

SEGMENT_SUFFIX = ".jsonl"


class JournalError(OSError):
    """The journal could not be written."""


class Journal:
    """The writing side: appends lines durably, in groups."""

    def __init__(self, directory: Path, *, sync: bool = True, segment_bytes: int = 64 << 20):
        self.directory = directory
        self.sync = sync
        self.segment_bytes = segment_bytes
        self._sequence = 0
        self.prefix = f"{os.getpid()}-{secrets.token_hex(4)}-"
        self._fd = -1
        self._size = 0
        self.path: Path | None = None
        self._buffer: list[bytes] = []
        self._group: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._rotate()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in segments(self.directory))

    async def append(self, line: bytes) -> None:
        """Add one line; returns once its group is written (and synced, if on)."""
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
                if self.sync:
                    # In a thread even for one record: a sync can take milliseconds when
                    # the disk is busy (seen here), and the loop must keep serving.
                    await asyncio.to_thread(self._write, data)
                else:
                    self._write(data)
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
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(data)
        if self.sync:
            os.fdatasync(self._fd)

    def _rotate(self) -> None:
        self.close()
        self._sequence += 1
        self.path = self.directory / f"{self.prefix}{self._sequence:06d}{SEGMENT_SUFFIX}"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._size = os.fstat(self._fd).st_size


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
