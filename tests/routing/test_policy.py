"""Routing policies on plain lists: each policy, the imbalance guard, ties."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.routing.policy import (
    DEFAULT_TUNABLES,
    NoReplicaError,
    ReplicaView,
    RouteRequest,
    Tunables,
    choose,
    kv_costs,
)

IDLE = [ReplicaView(name=f"r{i}") for i in range(4)]


def request(
    prompt_tokens: int = 8000, *, seq: int = 0, key: int = 0, interaction: int = 0
) -> RouteRequest:
    return RouteRequest(
        seq=seq, key=key, interaction=interaction, prompt_tokens=prompt_tokens, block_tokens=512
    )


def test_round_robin_follows_the_sequence_number() -> None:
    assert [choose("round-robin", request(seq=s), IDLE) for s in range(6)] == [0, 1, 2, 3, 0, 1]


def test_random_is_a_function_of_the_request_key() -> None:
    assert [choose("random", request(key=k), IDLE) for k in range(6)] == [0, 1, 2, 0, 0, 0]
    spread = Counter(choose("random", request(key=k), IDLE * 2) for k in range(8000))
    assert sorted(spread) == list(range(8))
    assert all(900 < n < 1100 for n in spread.values())


def test_least_loaded_takes_fewest_in_flight_then_least_queued() -> None:
    views = [
        ReplicaView("a", in_flight=3),
        ReplicaView("b", in_flight=1, queued_prefill_tokens=900),
        ReplicaView("c", in_flight=1, queued_prefill_tokens=100),
        ReplicaView("d", in_flight=2),
    ]
    assert choose("least-loaded", request(), views) == 2


def test_least_loaded_ignores_the_cache() -> None:
    views = [ReplicaView("a", matched_blocks=15, in_flight=1), ReplicaView("b", in_flight=0)]
    assert choose("least-loaded", request(), views) == 1


def test_session_sticks_to_the_interaction_whatever_the_load() -> None:
    idle = choose("session", request(interaction=42), IDLE)
    busy = [ReplicaView(v.name, in_flight=50, queued_prefill_tokens=10**6) for v in IDLE]
    assert choose("session", request(interaction=42), busy) == idle == 1
    spread = Counter(choose("session", request(interaction=i), IDLE) for i in range(4000))
    assert all(900 < n < 1100 for n in spread.values())


def test_session_moves_only_the_interactions_of_a_replica_that_leaves() -> None:
    before = {i: IDLE[choose("session", request(interaction=i), IDLE)].name for i in range(400)}
    rest = IDLE[:1] + IDLE[2:]
    after = {i: rest[choose("session", request(interaction=i), rest)].name for i in range(400)}
    moved = {i for i in before if before[i] != after[i]}
    assert moved == {i for i in before if before[i] == "r1"}


def test_kv_aware_prefers_the_replica_holding_the_prefix() -> None:
    views = [
        ReplicaView("a"),
        ReplicaView("b", matched_blocks=10),
        ReplicaView("c", matched_blocks=2),
    ]
    assert kv_costs(request(8000), views, DEFAULT_TUNABLES) == [8000, 2880, 6976]
    assert choose("kv-aware", request(8000), views) == 1


def test_kv_aware_weighs_queued_prefill_against_cached_tokens() -> None:
    # b saves 2,048 tokens but has 30,000 queued; even at load_weight 0.1 that is too much.
    views = [
        ReplicaView("a", queued_prefill_tokens=0),
        ReplicaView("b", matched_blocks=4, queued_prefill_tokens=30_000),
    ]
    tunables = Tunables(load_weight=0.1, imbalance_factor=100.0)
    assert kv_costs(request(8000), views, tunables) == [8000, 8952]
    assert choose("kv-aware", request(8000), views, tunables) == 0
    # With a full TTFT weight a smaller queue already tips it.
    views = [
        ReplicaView("a", queued_prefill_tokens=1000),
        ReplicaView("b", matched_blocks=4, queued_prefill_tokens=4000),
    ]
    assert choose("kv-aware", request(8000), views, Tunables(load_weight=1.0)) == 0
    assert choose("kv-aware", request(8000), views, Tunables(load_weight=0.1)) == 1


def test_the_imbalance_guard_takes_affinity_from_an_outlying_replica() -> None:
    views = [
        ReplicaView("hot", matched_blocks=10, queued_prefill_tokens=20_000),
        ReplicaView("a"),
        ReplicaView("b"),
        ReplicaView("c"),
    ]
    guarded = Tunables(load_weight=0.1, imbalance_factor=1.25, imbalance_floor_tokens=4096)
    # mean load 5,000; limit 1.25 * 5,000 + 4,096 = 10,346; 9,654 tokens over it count in full.
    costs = kv_costs(request(8000), views, guarded)
    assert costs[0] == pytest.approx(2880 + 2000 + 0.9 * 9654)
    assert costs[1:] == [8000, 8000, 8000]
    assert choose("kv-aware", request(8000), views, guarded) in (1, 2, 3)
    unguarded = Tunables(load_weight=0.1, imbalance_factor=10.0, imbalance_floor_tokens=4096)
    assert choose("kv-aware", request(8000), views, unguarded) == 0


def test_an_outlying_replica_keeps_a_request_its_cache_saves_more_than_its_excess() -> None:
    views = [
        ReplicaView("hot", matched_blocks=15, queued_prefill_tokens=12_000),
        ReplicaView("a"),
        ReplicaView("b"),
        ReplicaView("c"),
    ]
    tunables = Tunables(load_weight=0.1)
    # limit 1.25 * 3,000 + 4,096 = 7,846; cost 320 + 1,200 + 0.9 * 4,154 < 8,000.
    assert kv_costs(request(8000), views, tunables)[0] == pytest.approx(5258.6)
    assert choose("kv-aware", request(8000), views, tunables) == 0


def test_an_idle_fleet_is_never_imbalanced() -> None:
    views = [ReplicaView("a", matched_blocks=4, queued_prefill_tokens=3000), ReplicaView("b")]
    # mean 1,500; limit 1,875 + 4,096 = 5,971 > 3,000: no excess.
    assert kv_costs(request(8000), views, DEFAULT_TUNABLES) == [8000 - 2048 + 150, 8000]


def test_running_sequences_count_as_load_when_priced() -> None:
    views = [ReplicaView("a", running=10), ReplicaView("b", running=0)]
    priced = Tunables(load_weight=1.0, running_tokens=100.0)
    assert kv_costs(request(1000), views, priced) == [2000, 1000]
    assert choose("kv-aware", request(1000), views, priced) == 1


def test_cached_tokens_never_exceed_the_prompt() -> None:
    views = [ReplicaView("a", matched_blocks=100)]
    assert kv_costs(request(1000), views, DEFAULT_TUNABLES) == [0]


def test_a_full_replica_is_chosen_only_when_all_are_full() -> None:
    views = [
        ReplicaView("full", matched_blocks=15, in_flight=4, capacity=4),
        ReplicaView("cold", in_flight=3, capacity=4),
    ]
    assert choose("kv-aware", request(8000), views) == 1
    all_full = [
        ReplicaView("x", in_flight=4, capacity=4),
        ReplicaView("y", matched_blocks=2, in_flight=9, capacity=4),
    ]
    assert choose("kv-aware", request(8000), all_full) == 1


def test_kv_aware_ties_go_to_fewer_in_flight_then_to_the_request_key() -> None:
    views = [
        ReplicaView("a", in_flight=2),
        ReplicaView("b", in_flight=1),
        ReplicaView("c", in_flight=1),
    ]
    picks = [choose("kv-aware", request(key=k), views) for k in range(8)]
    assert picks == [2, 1, 1, 1, 1, 2, 2, 1]  # never a, the busier
    assert [choose("kv-aware", request(key=k), IDLE) for k in range(6)] == [0, 3, 2, 3, 3, 2]


def test_a_tie_is_broken_by_replica_name_whatever_the_order_of_the_views() -> None:
    """Rendezvous over (key, name): the same request picks the same replica when the fleet
    lists its replicas in another order (another gateway, a restart)."""
    for views in (IDLE, IDLE[::-1], IDLE[1:] + IDLE[:1]):
        names = [views[choose("kv-aware", request(key=k), views)].name for k in range(6)]
        assert names == ["r0", "r3", "r2", "r3", "r3", "r2"], views


def test_least_loaded_ties_are_deterministic_and_spread() -> None:
    assert [choose("least-loaded", request(key=k), IDLE) for k in range(6)] == [0, 3, 2, 3, 3, 2]
    spread = Counter(choose("least-loaded", request(key=k), IDLE) for k in range(4000))
    assert all(900 < n < 1100 for n in spread.values())


def test_keys_of_any_size_are_accepted() -> None:
    """Keys are taken modulo 2**64: -1 is 2**64 - 1, and 2**70 is 0."""
    picks = {
        key: (
            choose("random", request(key=key), IDLE),
            choose("session", request(interaction=key), IDLE),
            choose("kv-aware", request(key=key), IDLE),
        )
        for key in (-1, 2**64 - 1, 2**70, 0)
    }
    assert picks == {-1: (3, 0, 0), 2**64 - 1: (3, 0, 0), 2**70: (0, 0, 0), 0: (0, 0, 0)}


def test_unknown_policy_and_empty_fleet_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        choose("fastest", request(), IDLE)
    with pytest.raises(NoReplicaError):
        choose("kv-aware", request(), [])


def test_tunables_are_validated() -> None:
    with pytest.raises(ValueError, match="load_weight"):
        Tunables(load_weight=1.5)
    with pytest.raises(ValueError, match="imbalance_factor"):
        Tunables(imbalance_factor=0.5)
    with pytest.raises(ValueError, match="running_tokens"):
        Tunables(running_tokens=-1)
