"""Summaries of a replay: hit rate, efficiency, percentiles, balance, Decimal cost."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gateway.tools.replay.metrics import Rates, parse_price, percentile, summarize
from gateway.tools.replay.offline import ReplayConfig, replay
from gateway.tools.replay.trace import TraceRequest
from gateway.tools.sim.timing import TimingModel

CONFIG = ReplayConfig(
    replicas=2,
    capacity_blocks=10,
    block_tokens=4,
    timing=TimingModel(prefill_tokens_per_s=100, decode_tokens_per_s=10),
)


def test_kv_aware_summary_on_the_tiny_trace(tiny: list[TraceRequest]) -> None:
    run = replay(tiny, "kv-aware", CONFIG)
    price = Rates(input=Decimal(1), cache_read=Decimal("0.1"), output=Decimal(2))
    s = summarize(run, ceiling=20 / 44, price=price)
    assert (s.requests, s.prompt_tokens, s.cached_tokens) == (4, 44, 20)
    assert s.token_hit_rate == 20 / 44
    assert s.efficiency == pytest.approx(1.0)
    assert s.ttft_p50_s == pytest.approx(0.16)
    assert s.ttft_p99_s == pytest.approx(0.18)
    assert s.prefill_tokens == 24
    assert sorted(s.prefill_tokens_per_replica) == [8, 16]
    assert sorted(s.requests_per_replica) == [1, 3]
    assert s.max_mean_load == pytest.approx(16 / 12)
    # 24 uncached at $1/M + 20 cached at $0.10/M; plus 4 output tokens at $2/M, per request.
    assert s.input_cost_usd == Decimal("0.000026000")
    assert s.cost_per_request_usd == Decimal("0.000008500")


def test_no_price_no_cost(tiny: list[TraceRequest]) -> None:
    s = summarize(replay(tiny, "round-robin", CONFIG), ceiling=0.5)
    assert s.input_cost_usd is None
    assert s.cost_per_request_usd is None
    assert s.token_hit_rate == 12 / 44
    assert s.efficiency == pytest.approx(24 / 44)


def test_percentile_interpolates_linearly() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert percentile([], 50) == 0.0


def test_parse_price() -> None:
    assert parse_price("input=3, cache_read=0.30,output=15") == Rates(
        Decimal(3), Decimal("0.30"), Decimal(15)
    )
    with pytest.raises(ValueError, match="missing output"):
        parse_price("input=3,cache_read=0.3")
    with pytest.raises(ValueError, match="want input=X"):
        parse_price("input=3,write=1,cache_read=0.3,output=1")
    with pytest.raises(ValueError, match="not a number"):
        parse_price("input=three,cache_read=0.3,output=1")
