"""Ceilings and trace shape, on a hand-made trace and on the shared Mooncake trace."""

from __future__ import annotations

import pytest

from gateway.tools.replay.analysis import (
    analyze,
    describe,
    infinite_ceiling,
    pooled_ceiling,
    repeat_gaps,
)
from gateway.tools.replay.trace import TraceRequest, load_trace
from tests.replay.conftest import SHARED_TRACE

# Blocks of 4 tokens; the last block of the second and third requests is partial.
CEILING_TRACE = [
    TraceRequest(0, 8, 1, (1, 2)),
    TraceRequest(1000, 10, 1, (1, 2, 3)),
    TraceRequest(2000, 10, 1, (1, 2, 3)),
    TraceRequest(4000, 6, 1, (9, 2)),
]


def test_infinite_ceiling_counts_seen_chains_token_weighted() -> None:
    ceiling = infinite_ceiling(CEILING_TRACE, block_tokens=4)
    # 0, then blocks 1-2 (8 tokens), then all of 1-3 (10 tokens: a seen partial block
    # counts its own tokens), then nothing: 9 was never seen, so 2 after it cannot count.
    assert (ceiling.prompt_tokens, ceiling.cached_tokens) == (34, 18)
    assert ceiling.rate == 18 / 34


def test_pooled_ceiling_is_one_lru_cache_of_full_blocks() -> None:
    # Two blocks: requests 2 and 3 hit both (capped at (10 - 1) // 4 = 2); request 4's
    # block 9 then evicts block 2, the least recently freed.
    two = pooled_ceiling(CEILING_TRACE, capacity_blocks=2, block_tokens=4)
    assert (two.prompt_tokens, two.cached_tokens) == (34, 16)
    # One block: only block 1 fits (block 2 finds every block pinned), so requests 2
    # and 3 hit 4 tokens each.
    one = pooled_ceiling(CEILING_TRACE, capacity_blocks=1, block_tokens=4)
    assert one.cached_tokens == 8


def test_repeat_intervals_are_seconds_between_uses_of_a_block() -> None:
    assert repeat_gaps(CEILING_TRACE) == [1.0, 1.0, 1.0, 1.0, 1.0, 2.0]
    shape = analyze(CEILING_TRACE, replicas=2, capacity_blocks=1, block_tokens=4)
    assert shape.repeat_intervals.count == 6
    assert shape.repeat_intervals.mean == pytest.approx(7 / 6)
    assert shape.prompt_lengths.at(50) == 9.0
    assert shape.pooled_capacity_blocks == 2
    assert shape.pooled.cached_tokens == 16


def test_describe_gives_interpolated_quantiles() -> None:
    d = describe([4.0, 1.0, 3.0, 2.0])
    assert (d.count, d.mean, d.minimum, d.maximum) == (4, 2.5, 1.0, 4.0)
    assert d.at(50) == 2.5
    assert d.at(10) == pytest.approx(1.3)
    assert describe([]).count == 0


def test_the_shared_mooncake_trace_ceiling_is_34_72_percent() -> None:
    assert SHARED_TRACE.exists(), f"the shared trace should be at {SHARED_TRACE}"
    requests = load_trace(SHARED_TRACE)
    assert len(requests) == 5719
    assert round(infinite_ceiling(requests).rate, 4) == 0.3472
