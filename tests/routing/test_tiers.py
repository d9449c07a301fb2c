"""Tiers in routing: both indexes keep where a block sits, the policy credits a match by
its tier's weight, and a deployment's weights and tiers are checked at start."""

from __future__ import annotations

import pytest

from gateway.routing.exact import ExactIndex, RoutingIndex
from gateway.routing.fleet_config import FleetConfig, FleetConfigError, tier_weights
from gateway.routing.index import ApproximateIndex
from gateway.routing.placement import Placer, Replica, make_route
from gateway.routing.policy import DEFAULT_TUNABLES, ReplicaView, RouteRequest, choose, kv_costs
from gateway.routing.prompts import Prompt
from gateway.routing.tiers import TierWeights, medium_rank, weight

WEIGHTS = TierWeights(cpu=0.8, storage=0.5).by_rank()


def test_a_tiers_weight_is_what_fetching_a_block_saves_of_its_prefill() -> None:
    assert weight(fetch_s=0.0027, prefill_s=0.0512) == pytest.approx(1 - 0.0027 / 0.0512)
    assert weight(fetch_s=0.1, prefill_s=0.05) == 0.0  # slower than recomputing: worthless
    assert weight(fetch_s=0.0, prefill_s=0.0) == 0.0
    assert [medium_rank(m) for m in (None, "GPU", "CPU", "STORAGE", "NVMe")] == [0, 0, 1, 2, 2]
    with pytest.raises(ValueError, match="cpu"):
        TierWeights(cpu=1.5)


def test_exact_fetch_cost_counts_each_block_by_its_fastest_copy() -> None:
    index = ExactIndex()
    index.block_stored("a", [1, 2], medium="GPU")
    assert index.fetch_blocks("a", [1, 2], 2, WEIGHTS) == 0.0  # GPU only: nothing asked
    index.block_stored("a", [3], medium="CPU")
    index.block_stored("a", [4], medium="STORAGE")
    index.block_stored("a", [2], medium="CPU")  # also in GPU memory: the GPU copy counts
    assert index.match("a", [1, 2, 3, 4]) == 4
    assert index.fetch_blocks("a", [1, 2, 3, 4], 4, WEIGHTS) == pytest.approx(0.2 + 0.5)
    assert index.fetch_blocks("a", [1, 2, 3, 4], 3, WEIGHTS) == pytest.approx(0.2)
    index.block_removed("a", [2], medium="GPU")
    assert index.fetch_blocks("a", [1, 2], 2, WEIGHTS) == pytest.approx(0.2)


def test_the_approximate_index_mirrors_the_tiers_below_gpu_memory() -> None:
    index = ApproximateIndex(2, lower=(2, 1))
    index.record("a", [1, 2, 3, 4, 5])  # tail first: 1 and 2 in GPU, 3 and 4 host, 5 disk
    assert index.match("a", [1, 2, 3, 4, 5]) == 5
    assert index.match_all([1, 2, 3, 4, 5]) == {"a": 5}
    assert index.fetch_blocks("a", [1, 2, 3, 4, 5], 5, WEIGHTS) == pytest.approx(0.2 * 2 + 0.5)
    index.record("a", [9])  # 2 to host, 4 to disk, 5 falls out
    assert index.match("a", [1, 2, 3, 4, 5]) == 4
    index.record("a", [3])  # placed again: back up into GPU memory
    assert index.fetch_blocks("a", [3], 1, WEIGHTS) == 0.0
    index.correct("a", [1, 2, 3, 4], 1, predicted_blocks=4)  # the replica had only 1
    assert index.match("a", [1, 2, 3, 4]) == 1
    index.forget("a")
    assert index.match_all([1]) == {}


def test_a_gpu_holder_beats_a_host_holder_of_the_same_blocks_by_their_fetch() -> None:
    request = RouteRequest(seq=0, key=0, interaction=0, prompt_tokens=8000, block_tokens=512)
    views = [
        ReplicaView("host", matched_blocks=10, fetch_tokens=10 * 512 * 0.2),
        ReplicaView("gpu", matched_blocks=10),
        ReplicaView("cold"),
    ]
    assert kv_costs(request, views, DEFAULT_TUNABLES) == pytest.approx([2880 + 1024, 2880, 8000])
    assert choose("kv-aware", request, views) == 1
    # A host copy of more blocks still beats a GPU copy of fewer.
    views = [ReplicaView("host", matched_blocks=14, fetch_tokens=14 * 512 * 0.2), views[1]]
    assert choose("kv-aware", request, views) == 0


def test_the_placer_prices_a_tiered_match_and_queues_its_fetch() -> None:
    index = RoutingIndex(ApproximateIndex(4))
    for name in ("a", "b"):
        index.set_fresh(name, True)
    index.block_stored("a", list(range(1, 11)), medium="CPU")
    placer = Placer(
        [Replica("a"), Replica("b")], index, tier_weights=TierWeights(cpu=0.8), name="m"
    )
    prompt = Prompt(list(range(1, 11)), 161, 16, True)  # 10 blocks; 161 tokens: all usable
    placement = placer.place(make_route(prompt, request_id="r", interaction_id="r"), now=0.0)
    assert (placement.replica.name, placement.predicted_blocks) == ("a", 10)
    # 1 uncached token + 10 blocks x 16 tokens x (1 - 0.8) of fetching.
    assert placement.queued_tokens == 1 + 32


def test_a_deployments_tiers_and_weights_are_checked() -> None:
    assert tier_weights({"cpu": 0.9}, model="m") == TierWeights(cpu=0.9)
    with pytest.raises(FleetConfigError, match="unknown tier weight 'gpu'"):
        tier_weights({"gpu": 1.0}, model="m")
    with pytest.raises(FleetConfigError, match="model 'm': tier weight storage"):
        tier_weights({"storage": -0.1}, model="m")
    with pytest.raises(FleetConfigError, match="disk_blocks needs cpu_blocks"):
        FleetConfig(name="m", replicas=("http://r",), disk_blocks=10)
    config = FleetConfig(name="m", replicas=("http://r",), cpu_blocks=8, disk_blocks=32)
    assert config.lower_blocks == (8, 32)
