"""A process's in-memory copy of one kind of database data (keys, prices, ...).

A copy is replaced whole, and only by a load of the same or a newer revision (see
db/changes.py): loads run in threads and can finish out of order, and a copy confirmed as
current must never be replaced by an older one that finished late.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("kvgate.mirror")
UNLOADED = -1  # nothing loaded from the database yet (empty, or a local snapshot)


class Mirror(Generic[T]):
    """The newest copy loaded of one kind of data, and what to do when it is replaced."""

    def __init__(self, kind: str, load: Callable[[], tuple[int, T]], value: T) -> None:
        self.kind = kind
        self.value = value
        self.revision = UNLOADED
        self._load = load
        self._lock = threading.Lock()
        self._on_install: list[Callable[[T], None]] = []

    def on_install(self, callback: Callable[[T], None]) -> None:
        """Call ``callback`` with every copy installed (under the lock: in order)."""
        self._on_install.append(callback)

    def follow(self, callback: Callable[[T], None]) -> None:
        """``on_install``, and ``callback`` with the copy held now (nothing missed between)."""
        with self._lock:
            self._on_install.append(callback)
            callback(self.value)

    def install(self, revision: int, value: T) -> bool:
        """Hold ``value`` unless a newer revision is held already."""
        with self._lock:
            if revision < self.revision:
                return False
            self.value, self.revision = value, revision
            for callback in self._on_install:
                callback(value)
            return True

    def replace(self, transform: Callable[[T], T]) -> None:
        """Change the held copy in place of the database (a revocation seen here first)."""
        with self._lock:
            self.value = transform(self.value)
            for callback in self._on_install:
                callback(self.value)

    def reload(self) -> int:
        """Load from the database and install; the revision held after (blocking: a thread)."""
        revision, value = self._load()
        self.install(revision, value)
        return self.revision

    def reload_checked(self) -> int:
        """The periodic safety-net reload. A load behind the revision held could have just
        been overtaken; one that started after that revision was installed and is still
        behind it means the database went back (restored from a backup): its copy wins."""
        revision, value = self._load()
        if self.install(revision, value):
            return self.revision
        held = self.revision  # the database had this before the load below began
        revision, value = self._load()
        with self._lock:
            if revision < held and self.revision == held:
                log.warning(
                    "%s: the database is at revision %d, behind the %d held here "
                    "(restored from a backup?); using the database's",
                    self.kind,
                    revision,
                    held,
                )
                self.revision = revision
        self.install(revision, value)
        return self.revision
