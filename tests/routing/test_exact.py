"""The exact index: holdings as KV events state them, copies and tiers counted; and the
routing view that trusts it only for replicas whose events are in sync."""

from __future__ import annotations

from gateway.routing.exact import ExactIndex, RoutingIndex
from gateway.routing.index import ApproximateIndex, BlockIndex, KvEventSink


def test_it_holds_what_was_stored_until_it_is_removed() -> None:
    index = ExactIndex()
    index.block_stored("a", [1, 2, 3], medium="GPU")
    assert index.match("a", [1, 2, 3, 4]) == 3
    index.block_removed("a", [3], medium="GPU")
    assert index.match("a", [1, 2, 3]) == 2
    assert index.blocks("a") == {1, 2}
    assert index.match("b", [1]) == 0


def test_a_hash_stored_twice_is_held_until_both_copies_go() -> None:
    index = ExactIndex()
    index.block_stored("a", [7], medium="GPU")
    index.block_stored("a", [7], medium="GPU")
    index.block_removed("a", [7], medium="GPU")
    assert index.match("a", [7]) == 1
    index.block_removed("a", [7], medium="GPU")
    assert index.match("a", [7]) == 0


def test_tiers_are_kept_per_copy_and_a_removal_names_its_tier() -> None:
    index = ExactIndex()
    index.block_stored("a", [5], medium="GPU")
    index.block_stored("a", [5], medium="CPU")
    assert index.tiers("a", 5) == {"GPU": 1, "CPU": 1}
    index.block_removed("a", [5], medium="GPU")
    assert index.tiers("a", 5) == {"CPU": 1}
    assert index.match("a", [5]) == 1
    index.block_removed("a", [5])  # no tier named: any copy
    assert index.tiers("a", 5) == {}


def test_clearing_one_replica_leaves_the_others() -> None:
    index = ExactIndex()
    index.block_stored("a", [1, 2])
    index.block_stored("b", [1, 2])
    index.all_blocks_cleared("a")
    assert index.match_all([1, 2]) == {"b": 2}
    index.block_removed("a", [1])  # unknown now: ignored
    index.forget("b")
    assert index.match_all([1, 2]) == {}


def test_match_all_walks_once_for_every_replica() -> None:
    index = ExactIndex()
    index.block_stored("a", [1, 2, 3, 4])
    index.block_stored("b", [1, 2])
    index.block_stored("c", [2, 3])
    assert index.match_all([1, 2, 3, 9]) == {"a": 3, "b": 2}
    assert index.match_all([2, 3]) == {"c": 2, "a": 2, "b": 1}
    assert index.match_all([]) == {}


def test_the_routing_view_uses_events_only_for_fresh_replicas() -> None:
    view = RoutingIndex(ApproximateIndex(capacity_blocks=100))
    view.record("a", [1, 2, 3])  # routed there: the approximate index believes it
    view.record("b", [1, 2, 3])
    view.exact.block_stored("a", [1])  # but a's events say it kept only the head
    assert view.match_all([1, 2, 3]) == {"a": 3, "b": 3}
    view.set_fresh("a", True)
    assert view.match_all([1, 2, 3]) == {"a": 1, "b": 3}
    assert view.match("a", [1, 2, 3]) == 1
    view.set_fresh("a", False)  # events stopped: back to the approximate view
    assert view.match("a", [1, 2, 3]) == 3
    assert view.fresh_replicas == frozenset()


def test_both_indexes_meet_the_protocols() -> None:
    exact: BlockIndex = ExactIndex()
    sink: KvEventSink = ExactIndex()
    routing: BlockIndex = RoutingIndex(ApproximateIndex(capacity_blocks=1))
    assert exact.match_all([]) == routing.match_all([]) == {}
    sink.all_blocks_cleared("a")
