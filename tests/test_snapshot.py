"""Local snapshots: written whole or not at all, read back exactly, never half-used."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson
import pytest

from gateway.auth import Principal, hash_key
from gateway.directory import snapshot
from pricing.book import PriceBook, load_catalog, price_from_mapping

ALICE = Principal("ten_a", "alice", "key_a", "tenant:ten_a")
VARIED = price_from_mapping(
    {
        "model": "m",
        "effective_from": "2026-12-01T10:00:00Z",
        "input": "3",
        "cache_read": "0.3",
        "cache_write": "3.75",
        "cache_write_1h": "6",
        "output": "15",
        "currency": "EUR",
        "source": "list",
        "captured_on": "2026-11-30",
        "long_context": {"above": 200000, "input": "6", "cache_read": "0.6", "output": "22.5"},
        "tiers": {"priority": {"input": "5", "cache_read": "0.5", "output": "25"}},
    }
)


def write_both(directory: Path, keys: dict[str, Principal], book: PriceBook) -> None:
    writer = snapshot.SnapshotWriter(directory)
    writer.start()
    writer.save(snapshot.KEYS, lambda: snapshot.keys_document(keys))
    writer.save(snapshot.PRICES, lambda: [snapshot.price_document(p) for p in book.entries()])
    writer.stop()


def test_keys_and_prices_read_back_exactly(tmp_path: Path) -> None:
    keys = {hash_key("kvg-a"): ALICE}
    book = PriceBook([*load_catalog(), VARIED])
    write_both(tmp_path, keys, book)
    found = snapshot.read_snapshot(tmp_path)
    assert found.keys == keys and found.prices is not None
    assert found.prices.entries() == book.entries()
    assert found.keys_saved_at is not None and found.prices_saved_at is not None
    assert oct((tmp_path / snapshot.KEYS).stat().st_mode & 0o777) == "0o600"
    assert "kvg-a" not in (tmp_path / snapshot.KEYS).read_text()  # hashes only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys.json", "prices.json"]


def test_a_failed_write_leaves_the_previous_snapshot_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / snapshot.KEYS
    snapshot.write_atomically(target, b'{"saved_at": "2026-12-01T00:00:00+00:00", "entries": {}}')

    def full_disk(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        snapshot.write_atomically(target, b"x" * 1000)
    assert orjson.loads(target.read_bytes())["entries"] == {}
    assert [p.name for p in tmp_path.iterdir()] == ["keys.json"]  # no temporary left


@pytest.mark.parametrize(
    "content", [b"", b"{not json", b'{"entries": {}}', b'{"saved_at": "x", "entries": 1}']
)
def test_an_unreadable_snapshot_is_not_used(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / snapshot.KEYS).write_bytes(content)
    (tmp_path / snapshot.PRICES).write_bytes(content)
    with caplog.at_level(logging.ERROR):
        found = snapshot.read_snapshot(tmp_path)
    assert (found.keys, found.prices) == (None, None)
    assert "not used" in caplog.text


def test_no_snapshot_yet(tmp_path: Path) -> None:
    assert snapshot.read_snapshot(tmp_path / "missing") == snapshot.Snapshot(None, None)
