"""Local snapshots of the keys (hashed, as the database holds them) and the prices, so a
gateway can start, and serve the keys it knew, while its database is unreachable.

A snapshot is written under ``<journal dir>/snapshot/`` each time a new copy is installed
(to a temporary file, flushed, then renamed over the old one: a reader finds the old
snapshot or the new one, never a torn one). The writes happen in a thread of their own, off
the event loop; the snapshots are read only at start, when the database cannot be reached.
Workers of one gateway share the directory: each writes whole files, the last one wins.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.auth import Principal
from pricing.book import Price, PriceBook, price_from_mapping

log = logging.getLogger("kvgate.snapshot")
KEYS = "keys.json"
PRICES = "prices.json"


def snapshot_directory(journal_dir: Path) -> Path:
    """Where the snapshots are kept: ``snapshot`` in the journal directory."""
    return journal_dir / "snapshot"


def keys_document(keys: Mapping[str, Principal]) -> dict[str, Any]:
    """The keys snapshot's document: each key hash to its principal's fields."""
    return {
        digest: {
            "tenant_id": p.tenant_id,
            "tenant_name": p.tenant_name,
            "api_key_id": p.api_key_id,
            "cache_scope": p.cache_scope,
            "break_context": p.break_context,
        }
        for digest, p in keys.items()
    }


def keys_from(document: Mapping[str, Any]) -> dict[str, Principal]:
    """The principals a keys snapshot document holds, by key hash."""
    return {digest: Principal(**fields) for digest, fields in document.items()}


def price_document(price: Price) -> dict[str, Any]:
    """A price entry as catalog data (``price_from_mapping`` reads it back exactly)."""
    entry: dict[str, Any] = {
        "model": price.model,
        "effective_from": price.effective_from.isoformat(),
        **price.base.to_mapping(),
        "currency": price.currency,
        "source": price.source,
        **(price.variants() or {}),
    }
    if price.captured_on is not None:
        entry["captured_on"] = price.captured_on.isoformat()
    return entry


def prices_from(document: list[Mapping[str, Any]]) -> PriceBook:
    """The price book a prices snapshot document holds."""
    return PriceBook(price_from_mapping(entry) for entry in document)


def write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` whole, durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    with contextlib.suppress(OSError):  # the rename itself, durable
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a gateway knew when it last reached its database."""

    keys: dict[str, Principal] | None
    prices: PriceBook | None
    keys_saved_at: datetime | None = None
    prices_saved_at: datetime | None = None


def _read(path: Path) -> tuple[Any, datetime] | None:
    try:
        document = orjson.loads(path.read_bytes())
        return document["entries"], datetime.fromisoformat(document["saved_at"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("snapshot %s unreadable (%s): not used", path, exc)
        return None


def read_snapshot(directory: Path) -> Snapshot:
    """The snapshots under ``directory`` (either part None when missing or unreadable)."""
    keys, prices = _read(directory / KEYS), _read(directory / PRICES)
    try:
        book = prices_from(prices[0]) if prices else None
        ring = keys_from(keys[0]) if keys else None
    except (ValueError, TypeError) as exc:
        log.error("snapshot under %s unreadable (%s): not used", directory, exc)
        return Snapshot(None, None)
    return Snapshot(
        keys=ring,
        prices=book,
        keys_saved_at=keys[1] if keys else None,
        prices_saved_at=prices[1] if prices else None,
    )


class SnapshotWriter:
    """Writes the newest copy of each snapshot in a thread; a newer copy queued while one
    is written replaces the one waiting (only the last matters)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._pending: dict[str, Callable[[], Any]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kvgate-snapshot", daemon=True)
        self.written = 0

    def start(self) -> None:
        """Start the writing thread."""
        self._thread.start()

    def save(self, name: str, entries: Callable[[], Any]) -> None:
        """Queue a snapshot; ``entries`` (run in the thread) gives its JSON-ready entries."""
        with self._lock:
            self._pending[name] = entries
        self._wake.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Write what is queued, then stop."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                pending, self._pending = self._pending, {}
            for name, entries in pending.items():
                document = {"saved_at": datetime.now(UTC).isoformat(), "entries": entries()}
                try:
                    write_atomically(self.directory / name, orjson.dumps(document))
                    self.written += 1
                except OSError as exc:
                    log.error("snapshot %s not written: %s", name, exc)
            if self._stopping and not self._pending:
                return
