"""The offline replay on hand-made traces, with hit counts and timings worked out by hand.

The tiny trace (blocks of 4 tokens; prefill 100 tokens/s, decode 10 tokens/s):

    r0 t=0  8 tokens [1, 2]        r2 t=1   8 tokens [7, 8]
    r1 t=1 12 tokens [1, 2, 3]     r3 t=2  16 tokens [1, 2, 3, 4]
"""

from __future__ import annotations

import pytest

from gateway.routing.policy import Tunables
from gateway.tools.replay.offline import LoadSample, ReplayConfig, replay
from gateway.tools.replay.trace import TraceRequest
from gateway.tools.sim.timing import TimingModel

TIMING = TimingModel(prefill_tokens_per_s=100, decode_tokens_per_s=10, max_num_seqs=64)


def config(**changes: object) -> ReplayConfig:
    values: dict[str, object] = {
        "replicas": 2,
        "capacity_blocks": 10,
        "block_tokens": 4,
        "timing": TIMING,
    }
    values.update(changes)
    return ReplayConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("index", ["approximate", "exact"])
def test_kv_aware_follows_the_prefix(tiny: list[TraceRequest], index: str) -> None:
    run = replay(tiny, "kv-aware", config(index=index))
    o = run.outcomes
    # r1 and r3 extend r0's chain and go where it went, hitting 2 and 3 blocks (each
    # capped one block short of the prompt); r2 shares nothing and takes the idle one.
    assert [x.cached_tokens for x in o] == [0, 8, 0, 12]
    assert [x.predicted_cached_tokens for x in o] == [0, 8, 0, 12]
    assert o[1].replica == o[3].replica == o[0].replica != o[2].replica
    # TTFT = prefill of the uncached tokens + one output token (0.1 s).
    assert [x.ttft_s for x in o] == pytest.approx([0.18, 0.14, 0.18, 0.14])
    assert [x.queue_s for x in o] == [0.0, 0.0, 0.0, 0.0]


def test_round_robin_scatters_the_chain(tiny: list[TraceRequest]) -> None:
    o = replay(tiny, "round-robin", config()).outcomes
    assert [x.replica for x in o] == [0, 1, 0, 1]
    # Only r3 lands where a prefix of it is: r1's three blocks on replica 1.
    assert [x.cached_tokens for x in o] == [0, 0, 0, 12]


def test_one_prefill_at_a_time_in_arrival_order() -> None:
    trace = [TraceRequest(0, 100, 10, (1,)), TraceRequest(0, 100, 10, (2,))]
    o = replay(trace, "round-robin", config(replicas=1, block_tokens=512)).outcomes
    assert [x.ttft_s for x in o] == pytest.approx([1.1, 2.1])
    assert [x.queue_s for x in o] == pytest.approx([0.0, 1.0])


def test_sequences_beyond_max_num_seqs_wait_for_a_slot() -> None:
    trace = [TraceRequest(0, 100, 10, (1,)), TraceRequest(0, 100, 10, (2,))]
    timing = TimingModel(prefill_tokens_per_s=100, decode_tokens_per_s=10, max_num_seqs=1)
    o = replay(trace, "round-robin", config(replicas=1, block_tokens=512, timing=timing)).outcomes
    # The first decodes its 10 tokens until t=2; only then does the second start.
    assert [x.ttft_s for x in o] == pytest.approx([1.1, 3.1])
    assert [x.queue_s for x in o] == pytest.approx([0.0, 2.0])


def test_a_full_cache_evicts_blocks_the_index_then_forgets_too() -> None:
    # One replica of 2 blocks; r1's [5, 6] evicts r0's blocks once r0 has finished,
    # in the cache and in the index alike, and r2 finds nothing either way.
    trace = [
        TraceRequest(0, 9, 1, (1, 2, 3)),
        TraceRequest(1000, 9, 1, (5, 6, 7)),
        TraceRequest(2000, 9, 1, (1, 2, 3)),
    ]
    run = replay(trace, "kv-aware", config(replicas=1, capacity_blocks=2))
    assert [x.cached_tokens for x in run.outcomes] == [0, 0, 0]
    assert [x.predicted_cached_tokens for x in run.outcomes] == [0, 0, 0]


def test_the_index_corrects_itself_from_reported_cached_tokens() -> None:
    # r0 pins both blocks of the only replica for 10 s, so r1 and r2 store nothing, but
    # the index believes r1 left [5, 6] there: it predicts 2 blocks for r2, r2 reports
    # 0, and the index drops the chain, so r3 is predicted correctly again.
    trace = [
        TraceRequest(0, 8, 100, (1, 2)),
        TraceRequest(1000, 12, 1, (5, 6, 7)),
        TraceRequest(2000, 12, 1, (5, 6, 7)),
        TraceRequest(3000, 12, 1, (5, 6, 7)),
    ]
    run = replay(trace, "kv-aware", config(replicas=1, capacity_blocks=2))
    assert [x.predicted_cached_tokens for x in run.outcomes] == [0, 0, 8, 0]
    assert [x.cached_tokens for x in run.outcomes] == [0, 0, 0, 0]


def test_the_router_sees_load_and_balances_cold_requests() -> None:
    trace = [TraceRequest(0, 1000, 50, (i,)) for i in range(1, 5)]
    run = replay(trace, "kv-aware", config(replicas=2, block_tokens=512))
    assert sorted(x.replica for x in run.outcomes) == [0, 0, 1, 1]
    assert run.load[0] == LoadSample(0.0, (0, 0))


def test_load_is_sampled_every_ten_seconds(tiny: list[TraceRequest]) -> None:
    trace = [*tiny, TraceRequest(25_000, 8, 1, (1, 2))]
    run = replay(trace, "kv-aware", config())
    assert [s.time_s for s in run.load] == [0.0, 10.0, 20.0]


def test_tunables_reach_the_policy(tiny: list[TraceRequest]) -> None:
    # With a full TTFT weight and no floor, r1 still follows its prefix: 4 uncached + 0
    # load beats 12 cold tokens.
    tunables = Tunables(load_weight=1.0, imbalance_floor_tokens=0)
    run = replay(tiny, "kv-aware", config(tunables=tunables))
    assert [x.cached_tokens for x in run.outcomes] == [0, 8, 0, 12]


def test_requests_must_be_in_arrival_order(tiny: list[TraceRequest]) -> None:
    with pytest.raises(ValueError, match="arrival order"):
        replay(list(reversed(tiny)), "kv-aware", config())


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="index"):
        config(index="psychic")
    with pytest.raises(ValueError, match="replicas"):
        config(replicas=0)
    with pytest.raises(ValueError, match="name each replica once"):
        config(replica_names=("a", "a"))
    with pytest.raises(ValueError, match="index_capacity_blocks"):
        config(index_capacity_blocks=0)


def test_a_router_that_believes_in_more_blocks_than_the_caches_hold_learns_otherwise() -> None:
    """One replica of 2 blocks: r1 evicts r0's blocks. Told the truth, the router knows;
    told 4 blocks (a deployment's capacity_blocks set too high), it predicts r0's blocks
    for r2, hears 0 cached, and drops them, just as r2 stores them again: r3 is predicted
    cold and hits, and the reply teaches the index back."""
    trace = [
        TraceRequest(0, 9, 1, (1, 2, 3)),
        TraceRequest(1000, 9, 1, (5, 6, 7)),
        TraceRequest(2000, 9, 1, (1, 2, 3)),
        TraceRequest(3000, 9, 1, (1, 2, 3)),
    ]
    truth = replay(trace, "kv-aware", config(replicas=1, capacity_blocks=2)).outcomes
    assert [x.predicted_cached_tokens for x in truth] == [0, 0, 0, 8]
    assert [x.cached_tokens for x in truth] == [0, 0, 0, 8]
    believing = config(replicas=1, capacity_blocks=2, index_capacity_blocks=4)
    wrong = replay(trace, "kv-aware", believing).outcomes
    assert [x.predicted_cached_tokens for x in wrong] == [0, 0, 8, 0]
    assert [x.cached_tokens for x in wrong] == [0, 0, 0, 8]


def test_replicas_take_the_names_given_and_ties_break_by_name_and_request_id() -> None:
    """Cold requests on an idle fleet tie; the gateway breaks ties by the request id's
    hash and the replica's name, and so does the replay once given both."""
    cold = [TraceRequest(n * 1000, 8, 1, (10 * n + 1, 10 * n + 2)) for n in range(12)]
    named = config(replicas=3, replica_names=("http://a", "http://b", "http://c"))
    by_position = [x.replica for x in replay(cold, "kv-aware", named).outcomes]
    assert len(set(by_position)) == 3  # spread, not piled on the first
    ids = [
        TraceRequest(r.timestamp_ms, 8, 1, r.hash_ids, request_id=f"req_{n}")
        for n, r in enumerate(cold)
    ]
    by_id = [x.replica for x in replay(ids, "kv-aware", named).outcomes]
    again = [x.replica for x in replay(ids, "kv-aware", named).outcomes]
    assert by_id == again != by_position


def test_progress_is_reported_per_request(tiny: list[TraceRequest]) -> None:
    seen: list[int] = []
    replay(tiny, "random", config(), progress=seen.append)
    assert seen == [1, 2, 3, 4]
