"""The simulated replica's lower tiers: what GPU memory evicts moves to host memory, then
to disk; a hit there is loaded back, counted as cached, by tier in the usage and in
vLLM's metrics, and announced in KV events with vLLM's media."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gateway.routing.kv_wire import BlockRemoved, BlockStored, Event
from gateway.tools.sim.cache import PrefixCache
from gateway.tools.sim.events import CacheEvents
from gateway.tools.sim.server import SimConfig
from gateway.tools.sim.timing import TimingModel
from tests.sim.conftest import SimFactory
from tests.sim.test_server import LABELS, MODEL, metric_values


def admit_and_release(cache: PrefixCache, blocks: Sequence[str]) -> list[int]:
    admission = cache.admit(blocks)
    cache.release(admission.pinned)
    return admission.hit_tiers


def test_gpu_evictions_move_down_the_tiers_and_fall_out_of_the_last() -> None:
    cache = PrefixCache(2, lower=(2, 1))
    admit_and_release(cache, ["a", "b"])
    admission = cache.admit(["c", "d"])  # evicts b then a (a request's tail goes first)
    assert admission.evicted == ["b", "a"]
    assert admission.moves == [(1, True, "b"), (1, True, "a")]
    cache.release(admission.pinned)
    admission = cache.admit(["e"])  # evicts d into host memory, which pushes b to disk
    assert admission.moves == [(1, True, "d"), (1, False, "b"), (2, True, "b")]
    assert [cache.tier_of(b) for b in "abcde"] == [1, 2, 0, 1, 0]
    cache.release(admission.pinned)
    admission = cache.admit(["f"])  # c to host; a to disk; b falls out
    assert admission.moves == [(1, True, "c"), (1, False, "a"), (2, True, "a"), (2, False, "b")]
    assert cache.tier_of("b") is None
    assert (len(cache), cache.tier_blocks(1), cache.tier_blocks(2)) == (2, ["d", "c"], ["a"])


def test_a_lower_tier_hit_is_loaded_back_and_leaves_its_tier() -> None:
    cache = PrefixCache(2, lower=(4,))
    admit_and_release(cache, ["a", "b"])
    admit_and_release(cache, ["x", "y"])  # a and b to host memory
    assert cache.match(["a", "b", "z"]) == 2
    admission = cache.admit(["a", "b", "z"])
    assert (admission.hit_blocks, admission.hit_tiers) == (2, [1, 1])
    assert admission.stored == ["a", "b"]  # loaded into GPU memory; z finds no room
    assert (1, False, "a") in admission.moves and (1, False, "b") in admission.moves
    assert cache.tier_of("a") == cache.tier_of("b") == 0
    assert "a" not in cache.tier_blocks(1)


def test_the_tiers_together_hold_their_combined_capacity() -> None:
    cache = PrefixCache(2, lower=(3,))
    for block in "abcde":
        admit_and_release(cache, [block])
    assert sorted(b for b in "abcde" if cache.tier_of(b) is not None) == list("abcde")
    admit_and_release(cache, ["f"])
    assert cache.tier_of("a") is None


def test_a_loaded_block_with_no_gpu_room_goes_back_and_the_hit_ends_there() -> None:
    cache = PrefixCache(2, lower=(4,))
    admit_and_release(cache, ["a", "b"])
    admit_and_release(cache, ["x", "y"])
    pinned = cache.admit(["p", "q"])  # every GPU block pinned now
    admission = cache.admit(["a", "b"])
    assert (admission.hit_blocks, admission.hit_tiers, admission.pinned) == (0, [], [])
    assert cache.tier_of("a") == cache.tier_of("b") == 1
    cache.release(pinned.pinned)


def test_a_gpu_only_cache_reports_every_hit_from_gpu_and_moves_nothing() -> None:
    cache = PrefixCache(4)
    admit_and_release(cache, ["a", "b", "c"])
    admission = cache.admit(["a", "b", "d"])
    assert (admission.hit_tiers, admission.moves) == ([0, 0], [])


def test_timing_loads_lower_tier_blocks_at_their_cost() -> None:
    timing = TimingModel(cpu_block_ms=2.0, disk_block_ms=10.0)
    assert timing.fetch_seconds([5, 3, 1]) == pytest.approx(0.016)
    assert timing.fetch_seconds([5]) == 0.0
    with pytest.raises(ValueError, match="cpu_block_ms"):
        TimingModel(cpu_block_ms=-1)


class Captured:
    """Stands in for the ZMQ publisher: keeps each batch's events."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = []

    def publish(self, events: Sequence[Event]) -> None:
        if events:
            self.batches.append(list(events))


def test_events_name_each_tier_with_vllms_media_in_the_order_things_moved() -> None:
    captured = Captured()
    events = CacheEvents(captured, block_size=4)  # type: ignore[arg-type]
    cache = PrefixCache(1, lower=(1,))
    digests = [bytes([n]) * 32 for n in range(3)]
    a, b, c = digests
    for block in (a, b):
        admission = cache.admit([block])
        events.admitted(admission, [block], [1, 2, 3, 4], None)
        cache.release(admission.pinned)
    admission = cache.admit([c])  # b: GPU → host memory; a falls out of host memory
    events.admitted(admission, [c], [1, 2, 3, 4], None)
    key = {d: int.from_bytes(d[-8:], "big") for d in digests}
    assert captured.batches[-1] == [
        BlockRemoved((key[b],), medium="GPU"),
        BlockStored((key[b],), medium="CPU"),
        BlockRemoved((key[a],), medium="CPU"),
        BlockStored(
            (key[c],), token_ids=(1, 2, 3, 4), block_size=4, medium="GPU", extra_keys=(None,)
        ),
    ]


TIERED = SimConfig(
    block_size=4,
    capacity_blocks=2,
    cpu_blocks=8,
    timing=TimingModel(prefill_tokens_per_s=0, decode_tokens_per_s=0, cpu_block_ms=0.0),
    max_model_len=64,
)
# 12 tokens: 2 cacheable blocks of 4 (and "<|user|>\n" ... as in test_server).
TEN = [{"role": "user", "content": "a b c d e f g h i j"}]
OTHER = [{"role": "user", "content": "k l m n o p q r s t"}]


async def test_usage_and_metrics_say_which_tier_served_the_cached_tokens(sim: SimFactory) -> None:
    async with sim(TIERED) as s:
        first = await s.api.chat.completions.create(model=MODEL, messages=TEN, max_tokens=1)
        await s.api.chat.completions.create(model=MODEL, messages=OTHER, max_tokens=1)
        again = await s.api.chat.completions.create(model=MODEL, messages=TEN, max_tokens=1)
        metrics = await metric_values(s.base)
    assert first.usage is not None and again.usage is not None
    details = again.usage.model_dump()["prompt_tokens_details"]
    # OTHER pushed TEN's two blocks out of the 2 GPU blocks into host memory.
    assert details["cached_tokens"] == 8
    assert details["cached_tokens_by_source"] == {"device": 0, "host": 8, "disk": 0}
    assert first.usage.model_dump()["prompt_tokens_details"]["cached_tokens_by_source"] == {
        "device": 0,
        "host": 0,
        "disk": 0,
    }
    source = 'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="' + MODEL
    assert metrics[source + '",source="host"}'] == 8.0
    assert metrics[source + '",source="device"}'] == 0.0
    assert metrics[f"vllm:prefix_cache_hits_total{LABELS}"] == 0.0  # GPU memory's only
    assert metrics[f"vllm:external_prefix_cache_hits_total{LABELS}"] == 8.0
    assert metrics[f"vllm:external_prefix_cache_queries_total{LABELS}"] == 36.0
    by_source = 'vllm:prompt_tokens_by_source_total{engine="0",model_name="' + MODEL
    assert metrics[by_source + '",source="external_kv_transfer"}'] == 8.0
    assert metrics[by_source + '",source="local_compute"}'] == 28.0


async def test_a_gpu_only_replica_reports_no_tiers_in_its_usage(sim: SimFactory) -> None:
    config = SimConfig(block_size=4, timing=TimingModel.zero(), max_model_len=64)
    async with sim(config) as s:
        reply = await s.api.chat.completions.create(model=MODEL, messages=TEN, max_tokens=1)
    assert reply.usage is not None
    details = reply.usage.model_dump()["prompt_tokens_details"]
    assert details["cached_tokens"] == 0
    assert "cached_tokens_by_source" not in details  # its wire stays vLLM's exactly


def test_a_disk_tier_needs_a_host_tier_above_it() -> None:
    with pytest.raises(ValueError, match="CPU tier"):
        SimConfig(disk_blocks=10)
