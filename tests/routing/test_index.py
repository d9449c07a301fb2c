"""The approximate index: learns from routing, bounded per replica, corrected by reports."""

from __future__ import annotations

import pytest

from gateway.routing.index import ApproximateIndex, BlockIndex


def test_it_learns_what_it_routed() -> None:
    index = ApproximateIndex(capacity_blocks=100)
    index.record("a", [1, 2, 3])
    assert index.match("a", [1, 2, 3, 4]) == 3
    assert index.match("a", [1, 2, 9]) == 2
    assert index.match("a", [2, 3]) == 2
    assert index.match("b", [1, 2, 3]) == 0


def test_match_all_walks_the_chain_once_for_every_replica() -> None:
    index = ApproximateIndex(capacity_blocks=100)
    index.record("a", [1, 2, 3, 4])
    index.record("b", [1, 2])
    index.record("c", [7, 8])
    assert index.match_all([1, 2, 3, 5]) == {"a": 3, "b": 2}
    assert index.match_all([7, 8, 9]) == {"c": 2}
    assert index.match_all([5]) == {}
    assert index.match_all([]) == {}


def test_each_replica_is_an_lru_bounded_by_its_capacity_tail_first() -> None:
    index = ApproximateIndex(capacity_blocks=4)
    index.record("a", [1, 2, 3])
    index.record("a", [10, 11])
    # Five blocks for four places: the oldest, the first request's tail (3), goes.
    assert index.blocks("a") == 4
    assert index.match("a", [1, 2, 3]) == 2
    assert index.match("a", [10, 11]) == 2
    assert index.match_all([1, 2, 3]) == {"a": 2}


def test_a_use_refreshes_blocks() -> None:
    index = ApproximateIndex(capacity_blocks=3)
    index.record("a", [1, 2])
    index.record("a", [5])
    index.record("a", [1, 2])  # 1 and 2 are now newer than 5
    index.record("a", [6])
    assert index.match("a", [5]) == 0
    assert index.match("a", [1, 2]) == 2


def test_capacity_can_differ_per_replica() -> None:
    index = ApproximateIndex(capacity_blocks=2, capacities={"big": 5})
    index.record("big", [1, 2, 3, 4, 5])
    index.record("small", [1, 2, 3, 4, 5])
    assert index.blocks("big") == 5
    assert index.blocks("small") == 2
    assert index.match_all([1, 2, 3, 4, 5]) == {"big": 5, "small": 2}


def test_fewer_cached_blocks_than_predicted_drops_the_chain_from_the_first_miss() -> None:
    index = ApproximateIndex(capacity_blocks=100)
    index.record("a", [1, 2, 3, 4])
    index.record("b", [1, 2, 3, 4])
    index.correct("a", [1, 2, 3, 4], 1, predicted_blocks=4)
    assert index.match("a", [1, 2, 3, 4]) == 1
    assert index.blocks("a") == 1
    assert index.match_all([1, 2, 3, 4]) == {"a": 1, "b": 4}


def test_a_report_matching_the_prediction_changes_nothing() -> None:
    index = ApproximateIndex(capacity_blocks=100)
    index.record("a", [1, 2, 3, 4])
    # New blocks are never "missing": 1 predicted, 1 reported, the rest were computed.
    index.correct("a", [1, 2, 3, 4], 1, predicted_blocks=1)
    assert index.match("a", [1, 2, 3, 4]) == 4


def test_more_cached_blocks_than_predicted_are_learned() -> None:
    index = ApproximateIndex(capacity_blocks=100)
    index.correct("a", [1, 2, 3], 2, predicted_blocks=0)
    assert index.match("a", [1, 2, 3]) == 2


def test_forget_drops_a_replica_and_frees_its_slot() -> None:
    index = ApproximateIndex(capacity_blocks=100)
    index.record("a", [1, 2])
    index.record("b", [1])
    index.forget("a")
    index.forget("unknown")
    assert index.match("a", [1, 2]) == 0
    assert index.match_all([1, 2]) == {"b": 1}
    assert len(index) == 1
    index.record("c", [1, 2])
    assert index.match_all([1, 2]) == {"b": 1, "c": 2}


def test_more_replicas_than_a_machine_word_has_bits() -> None:
    index = ApproximateIndex(capacity_blocks=10)
    for i in range(100):
        index.record(f"r{i}", [1, *range(1000 * i, 1000 * i + i % 3)])
    found = index.match_all([1, 1000 * 98, 1000 * 98 + 1])
    assert found["r98"] == 3
    assert found["r97"] == 1
    assert len(found) == 100


def test_it_satisfies_the_block_index_protocol() -> None:
    index: BlockIndex = ApproximateIndex(capacity_blocks=1)
    assert index.match("x", []) == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity_blocks"):
        ApproximateIndex(capacity_blocks=0)
