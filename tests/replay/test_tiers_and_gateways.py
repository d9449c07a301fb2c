"""Replay with cache tiers below GPU memory and with several gateway instances: worked out
by hand on tiny traces, and through the command line.

Tiers: one replica of 2 GPU blocks of 4 tokens and 4 blocks of host memory; prefill 100
tokens/s (0.04 s a block), a host block loads in 10 ms, so the router's host weight is
1 - 0.01 / 0.04 = 0.75.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from gateway.tools.replay.analysis import analyze
from gateway.tools.replay.metrics import summarize
from gateway.tools.replay.offline import ReplayConfig, replay
from gateway.tools.replay.trace import TraceRequest
from gateway.tools.sim.timing import TimingModel
from tests.replay.test_cli import TINY_FLEET, app

TIMING = TimingModel(
    prefill_tokens_per_s=100, decode_tokens_per_s=10, max_num_seqs=64, cpu_block_ms=10.0
)
EVICTED_TO_HOST = [
    TraceRequest(0, 9, 1, (1, 2, 3)),
    TraceRequest(1000, 9, 1, (5, 6, 7)),  # pushes 1 and 2 out of GPU memory, to the host
    TraceRequest(2000, 9, 1, (1, 2, 3)),
]


@pytest.mark.parametrize("index", ["approximate", "exact"])
def test_a_hit_in_host_memory_is_cached_by_tier_and_costs_its_load_time(index: str) -> None:
    config = ReplayConfig(
        replicas=1, capacity_blocks=2, cpu_blocks=4, block_tokens=4, timing=TIMING, index=index
    )
    assert config.tier_weights.cpu == pytest.approx(0.75)
    outcomes = replay(EVICTED_TO_HOST, "kv-aware", config).outcomes
    assert [o.cached_tokens for o in outcomes] == [0, 0, 8]
    assert outcomes[2].cached_by_tier == (0, 8, 0)
    assert outcomes[2].predicted_cached_tokens == 8  # the router knew it was on the host
    # 1 uncached token (0.01 s) + 2 blocks from the host (0.02 s) + the first token (0.1 s).
    assert outcomes[2].ttft_s == pytest.approx(0.13)
    summary = summarize(replay(EVICTED_TO_HOST, "kv-aware", config), ceiling=8 / 27)
    assert summary.cached_by_tier == (0, 8, 0)
    assert summary.tier_rate(1) == pytest.approx(8 / 27)


def test_without_the_host_tier_the_same_trace_misses() -> None:
    config = ReplayConfig(replicas=1, capacity_blocks=2, block_tokens=4, timing=TIMING)
    assert [o.cached_tokens for o in replay(EVICTED_TO_HOST, "kv-aware", config).outcomes] == [
        0,
        0,
        0,
    ]


def test_the_pooled_ceiling_of_the_combined_capacity() -> None:
    analysis = analyze(EVICTED_TO_HOST, replicas=1, capacity_blocks=2, block_tokens=4)
    assert analysis.pooled.rate == 0.0 and analysis.pooled_tiers is None
    tiered = analyze(EVICTED_TO_HOST, replicas=1, capacity_blocks=2, block_tokens=4, lower_blocks=4)
    assert tiered.pooled_tiers is not None
    assert (tiered.pooled_tiers.cached_tokens, tiered.pooled_tiers_capacity_blocks) == (8, 6)


def test_instances_take_requests_in_turn_and_exact_mode_loses_nothing(
    tiny: list[TraceRequest],
) -> None:
    """Two instances behind a round robin: r1 and r3 (which extend r0's chain) go to the
    second one. Following the replicas' events it finds r0's blocks as the first instance
    would; learning only from its own placements it cannot know where r0 went."""
    fleet = {"replicas": 2, "capacity_blocks": 10, "block_tokens": 4, "timing": TIMING}
    one = replay(tiny, "kv-aware", ReplayConfig(index="exact", **fleet)).outcomes  # type: ignore[arg-type]
    two = replay(tiny, "kv-aware", ReplayConfig(index="exact", gateways=2, **fleet)).outcomes  # type: ignore[arg-type]
    assert [o.gateway for o in two] == [0, 1, 0, 1]
    assert [o.cached_tokens for o in two] == [o.cached_tokens for o in one] == [0, 8, 0, 12]
    learned = replay(tiny, "kv-aware", ReplayConfig(gateways=2, **fleet)).outcomes  # type: ignore[arg-type]
    assert learned[1].predicted_cached_tokens == 0


def test_the_command_line_reports_tiers_and_the_loss_per_gateway_count(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            f'{{"timestamp": {r.timestamp_ms}, "input_length": {r.input_length}, '
            f'"output_length": 1, "hash_ids": {list(r.hash_ids)}}}\n'
            for r in EVICTED_TO_HOST
        )
    )
    fleet = [*TINY_FLEET]
    fleet[fleet.index("--replicas") + 1] = "1"
    fleet[fleet.index("--capacity-blocks") + 1] = "2"
    result = CliRunner().invoke(
        app(),
        [
            str(trace),
            *fleet,
            "--policies",
            "kv-aware",
            "--cpu-blocks",
            "4",
            "--cpu-block-ms",
            "10",
            "--gateways",
            "1,2",
            "--report",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "pooled ceiling of the combined capacity (6 blocks in one LRU cache): 29.63%" in lines
    assert any("router's tier weights: host 0.750" in line for line in lines)
    assert (
        "| kv-aware | 29.63% | 0.00% | 29.63% | 0.00% | 100.0% | 88.9% | 0.19 | 0.19 | 8 |" in lines
    )
    assert any(line.startswith("| kv-aware | 2 | ") for line in lines)
    data = orjson.loads((tmp_path / "out" / "report.json").read_bytes())
    assert sorted(data["policies"]) == ["kv-aware", "kv-aware@2"]
    assert data["policies"]["kv-aware"]["cached_tokens_by_tier"] == {"gpu": 0, "host": 8, "disk": 0}
    assert data["pooled_tiers_ceiling"] == pytest.approx(8 / 27)


def test_tier_and_gateway_options_are_checked(tiny_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app(), [str(tiny_path), "--disk-blocks", "8"])
    assert result.exit_code == 2
    assert "give --cpu-blocks too" in result.output
    result = runner.invoke(app(), [str(tiny_path), "--gateways", "0"])
    assert result.exit_code == 2
    assert "at least 1" in result.output
