"""The report directory: markdown, JSON, plots and per-request CSVs."""

from __future__ import annotations

import csv
from decimal import Decimal
from pathlib import Path

import orjson

from gateway.routing.policy import DEFAULT_TUNABLES
from gateway.tools.replay.analysis import analyze
from gateway.tools.replay.metrics import Rates, summarize
from gateway.tools.replay.offline import ReplayConfig, replay
from gateway.tools.replay.report import ReportContext, policy_table, write_report
from gateway.tools.replay.trace import TraceRequest
from gateway.tools.sim.timing import TimingModel

TIMING = TimingModel(prefill_tokens_per_s=100, decode_tokens_per_s=10)


def test_write_report(tiny: list[TraceRequest], tmp_path: Path) -> None:
    config = ReplayConfig(replicas=2, capacity_blocks=10, block_tokens=4, timing=TIMING)
    analysis = analyze(tiny, replicas=2, capacity_blocks=10, block_tokens=4)
    price = Rates(Decimal(1), Decimal("0.1"), Decimal(2))
    runs = [replay(tiny, name, config) for name in ("kv-aware", "round-robin")]
    summaries = [summarize(r, ceiling=analysis.ceiling.rate, price=price) for r in runs]
    context = ReportContext(
        trace="tiny.jsonl",
        replicas=2,
        capacity_blocks=10,
        block_tokens=4,
        timing=TIMING,
        index="approximate",
        tunables=DEFAULT_TUNABLES,
        price=price,
        version="0.1.0",
        commit="abc123",
    )
    out = tmp_path / "report"
    write_report(
        out, context=context, analysis=analysis, requests=tiny, runs=runs, summaries=summaries
    )

    assert sorted(p.name for p in out.iterdir()) == [
        "hit_rate.png",
        "load.png",
        "report.json",
        "report.md",
        "requests-kv-aware.csv",
        "requests-round-robin.csv",
        "trace.png",
        "ttft.png",
    ]
    assert all(
        (out / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        for n in ("hit_rate.png", "ttft.png", "load.png", "trace.png")
    )
    data = orjson.loads((out / "report.json").read_bytes())
    assert data["requests"] == 4
    assert data["ceiling"] == 20 / 44
    assert data["pooled_ceiling"] == 20 / 44
    kv = data["policies"]["kv-aware"]
    assert kv["token_hit_rate"] == 20 / 44
    assert kv["efficiency"] == 1.0
    assert kv["prefill_tokens"] == 24
    assert kv["input_cost_usd"] == "0.000026000"
    assert data["policies"]["round-robin"]["token_hit_rate"] == 12 / 44
    assert data["fleet"]["timing"] == {
        "prefill_tokens_per_s": 100,
        "decode_tokens_per_s": 10,
        "max_num_seqs": 64,
        "cpu_block_ms": 0.0,
        "disk_block_ms": 0.0,
    }
    assert data["kvgate"] == {"version": "0.1.0", "commit": "abc123"}

    markdown = (out / "report.md").read_text()
    assert "- infinite-cache ceiling: **45.45%**" in markdown
    assert "| kv-aware | 45.45% | 100.0% |" in markdown
    assert "commit `abc123`" in markdown

    with (out / "requests-kv-aware.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [int(r["cached_tokens"]) for r in rows] == [0, 8, 0, 12]
    assert rows[1]["ttft_s"] == "0.140000"


def test_policy_table_without_price(tiny: list[TraceRequest]) -> None:
    config = ReplayConfig(replicas=2, capacity_blocks=10, block_tokens=4, timing=TIMING)
    summary = summarize(replay(tiny, "round-robin", config), ceiling=0.5)
    table = policy_table([summary])
    assert table.splitlines()[0].startswith("| policy | token hit rate | efficiency |")
    assert table.splitlines()[2].startswith("| round-robin | 27.27% | 54.5% | ")
    assert "cost" not in table
