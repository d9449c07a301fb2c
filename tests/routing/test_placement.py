"""The placement module on plain values: capacity, the hit cap, load accounting, learning.

Prompts here are 16-token blocks; the index is the gateway's RoutingIndex over an
approximate index, as the live fleet and the replay both build it.
"""

from __future__ import annotations

import pytest

from gateway.routing.exact import RoutingIndex
from gateway.routing.index import ApproximateIndex
from gateway.routing.load import ReplicaLoad
from gateway.routing.placement import (
    NoReplicaAvailable,
    Placer,
    Replica,
    Route,
    make_route,
    tokens_for_blocks,
)
from gateway.routing.prompts import Prompt

BLOCK = 16


def placer(*names: str, capacity: int = 256, policy: str = "kv-aware") -> Placer:
    replicas = [Replica(name, capacity=capacity) for name in names]
    return Placer(replicas, RoutingIndex(ApproximateIndex(1000)), policy=policy, name="m")


def prompt(blocks: int, tokens: int, *, exact: bool = True, first: int = 1) -> Prompt:
    return Prompt(list(range(first, first + blocks)), tokens, BLOCK, exact)


def route(p: Prompt, request_id: str = "r") -> Route:
    return make_route(p, request_id=request_id, interaction_id=request_id)


def test_a_replica_with_every_sequence_slot_taken_is_passed_over() -> None:
    """Capacity is the deployment's max_num_seqs: with 2, the third request leaves the
    replica that holds its prefix (with the old fixed 64 it would have stayed)."""
    placing = placer("a", "b", capacity=2)
    shared = prompt(10, 161)
    placing.index.record("a", shared.hashes)
    chosen = [placing.place(route(shared, f"r{n}"), now=0.0).replica.name for n in range(3)]
    assert chosen == ["a", "a", "b"]
    wide = placer("a", "b", capacity=64)
    wide.index.record("a", shared.hashes)
    assert [wide.place(route(shared, f"r{n}"), now=0.0).replica.name for n in range(3)] == [
        "a",
        "a",
        "a",
    ]


def test_a_predicted_hit_stops_short_of_the_prompts_last_token() -> None:
    """A 160-token prompt all held: vLLM computes its last token, so 9 of 10 blocks."""
    placing = placer("a")
    whole = prompt(10, 160)
    placing.index.record("a", whole.hashes)
    placement = placing.place(route(whole), now=0.0)
    assert (placement.predicted_blocks, placement.queued_tokens) == (9, 16)
    assert tokens_for_blocks(whole, placement.predicted_blocks, 160) == 144


def test_load_is_counted_from_placement_to_first_token_to_finish() -> None:
    placing = placer("a")
    replica = placing.replicas[0]
    first = placing.place(route(prompt(4, 100)), now=0.0)
    second = placing.place(route(prompt(4, 50, first=100)), now=0.0)
    assert (replica.in_flight, replica.queued_prefill_tokens, replica.running) == (2, 150, 0)
    placing.first_token(first)
    placing.first_token(first)  # a second first token changes nothing
    assert (replica.in_flight, replica.queued_prefill_tokens, replica.running) == (2, 50, 1)
    placing.finish(first)
    placing.finish(second)  # never started: its queued prefill goes
    placing.finish(second)
    assert (replica.in_flight, replica.queued_prefill_tokens, replica.running) == (0, 0, 0)


def test_a_replicas_own_reading_counts_when_it_is_higher() -> None:
    """Other gateways' requests: 5 running there outweigh this router's empty count."""
    placing = placer("busy", "idle", policy="least-loaded")
    placing.replicas[0].load = ReplicaLoad(running=3, waiting=2)
    assert placing.place(route(prompt(1, 20)), now=0.0).replica.name == "idle"


def test_a_reading_is_brought_up_to_date_with_this_routers_placements_since() -> None:
    """Both replicas read 2 in flight (other gateways' requests): this router's own
    placements since then count on top, so it alternates instead of sending every
    request until the next reading to the one that read first."""
    placing = placer("a", "b", policy="least-loaded")
    for replica in placing.replicas:
        replica.read(ReplicaLoad(running=2))
    chosen = [placing.place(route(prompt(1, 20), f"r{n}"), now=0.0) for n in range(4)]
    assert sorted(p.replica.name for p in chosen) == ["a", "a", "b", "b"]
    for placement in chosen:
        placing.finish(placement)
    assert [r.since_reading for r in placing.replicas] == [0, 0]
    placing.replicas[0].read(ReplicaLoad(running=1))  # a new reading starts the count again
    assert placing.place(route(prompt(1, 20), "r9"), now=0.0).replica.name == "a"


def test_no_available_replica_is_said_with_the_models_name() -> None:
    placing = placer("a", "b")
    placing.replicas[1].down_until = 10.0
    with pytest.raises(NoReplicaAvailable, match="no healthy replica for model 'm'"):
        placing.place(route(prompt(1, 20)), now=5.0, exclude=frozenset({"a"}))
    assert (
        placing.place(route(prompt(1, 20)), now=10.0, exclude=frozenset({"a"})).replica.name == "b"
    )


@pytest.mark.parametrize(("exact", "held_after"), [(False, 25), (True, 23)])
def test_one_block_short_is_rounding_in_text_mode_and_eviction_in_token_mode(
    exact: bool, held_after: int
) -> None:
    """25 blocks held, 24 predicted (the cap), 23 reported: text chunks only approximate
    token blocks, so one short is forgiven; exact blocks one short mean the replica
    evicted, and the index drops the chain from the first block it lost."""
    placing = placer("a")
    p = prompt(25, 400, exact=exact)
    placing.index.record("a", p.hashes)
    r = make_route(p, request_id="r", interaction_id="r")
    placement = placing.place(r, now=0.0)
    assert placement.predicted_blocks == 24
    learned = placing.learn(r, placement, cached_tokens=23 * BLOCK, prompt_tokens=400)
    assert (learned.reported_blocks, learned.predicted_blocks) == (24 if not exact else 23, 24)
    assert placing.index.match("a", p.hashes) == held_after
