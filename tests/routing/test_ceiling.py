"""The hit-rate ceiling: seen blocks per scope, a chain counting up to its first unseen block."""

from __future__ import annotations

import pytest

from gateway.routing.ceiling import HitCeiling


def test_a_block_counts_when_it_and_all_before_it_were_seen() -> None:
    ceiling = HitCeiling()
    assert ceiling.observe("s", [1, 2, 3]) == 0
    assert ceiling.observe("s", [1, 2, 4]) == 2
    assert ceiling.observe("s", [1, 5, 3]) == 1  # 3 was seen, but after the unseen 5
    assert ceiling.observe("s", [1, 2, 4, 6]) == 3
    assert ceiling.observe("s", []) == 0
    assert len(ceiling) == 6


def test_scopes_never_share_blocks() -> None:
    ceiling = HitCeiling()
    ceiling.observe("tenant-a", [1, 2])
    assert ceiling.observe("tenant-b", [1, 2]) == 0
    assert ceiling.observe("tenant-a", [1, 2]) == 2


def test_memory_is_bounded_by_forgetting_the_least_recently_seen_tail_first() -> None:
    ceiling = HitCeiling(max_entries=3)
    ceiling.observe("s", [1, 2, 3])
    ceiling.observe("s", [4])  # forgets 3, the first request's tail
    assert len(ceiling) == 3
    assert ceiling.observe("s", [1, 2, 3]) == 2


def test_max_entries_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        HitCeiling(max_entries=0)
