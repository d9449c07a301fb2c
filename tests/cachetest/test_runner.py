"""A small plan run in-process against a simulated replica on loopback, priced from the
command line: exact tokens and money in the summary, and every file of the report."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from gateway.tools.cachetest.plan import PLANS, RunConfig
from gateway.tools.cachetest.report import write_report
from gateway.tools.cachetest.runner import run
from gateway.tools.sim.server import SimConfig, create_app
from gateway.tools.sim.timing import TimingModel
from pricing.book import Rates

MODEL = "kvgate/demo-llama-8b"
PRICE = Rates(input=Decimal("0.20"), cache_read=Decimal("0.05"), output=Decimal("0.60"))
# 100 words: 102 prompt tokens (the template's head and tail), 6 full blocks of 16 cached.
SMALL = replace(
    PLANS["quick"],
    prompt_words=100,
    cold_warm_prompts=2,
    partial_steps=(0, 50, 100),
    concurrency_levels=(1, 4),
    concurrency_rounds=1,
    eviction_max_prompts=32,
)


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    # 64 blocks: ten 6-block prompts fit, sixteen do not.
    timing = TimingModel(prefill_tokens_per_s=0, decode_tokens_per_s=0)
    server = TestServer(create_app(SimConfig(model=MODEL, capacity_blocks=64, timing=timing)))
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_a_small_plan_priced_from_the_command_line(sim: str, tmp_path: Path) -> None:
    config = RunConfig(
        target=sim,
        key="k",
        model=MODEL,
        plan=SMALL,
        stages=("cold-warm", "partial", "concurrency", "eviction"),
        price=PRICE,
        seed=3,
    )
    progress = io.StringIO()
    results = await run(config, stream=progress)
    data = write_report(tmp_path, results)
    assert "cachetest [##############################]" in progress.getvalue()
    assert (data["kvgate_target"], data["price_source"]) == (False, "command line")
    assert (data["block_size"], data["target_cache_blocks"]) == (16, 64)
    assert not results.failed and data["exit_status"] == 0

    # Cold 102 x 0.20 = 20.4 µ$; warm 6 x 0.20 + 96 x 0.05 = 6 µ$; two prompts of each.
    rows = data["stages"]["cold-warm"]["requests"]
    assert [(r["cached_tokens"], r["input_cost_usd"]) for r in rows] == [
        (0, "0.000020400"),
        (96, "0.000006000"),
        (0, "0.000020400"),
        (96, "0.000006000"),
    ]
    summary = data["summary"]
    assert summary["input_cost_usd"] == "0.000052800"
    assert summary["uncached_input_cost_usd"] == "0.000081600"
    assert summary["billed_input_change"] == pytest.approx(-0.0000288 / 0.0000816, rel=1e-12)
    assert summary["warm_vs_cold_input_change"] == pytest.approx(-14.4 / 20.4, rel=1e-12)
    # Four requests, four output tokens each at 0.60: 9.6 µ$ of output in all.
    assert summary["cost_per_completed_usd"] == "0.000015600"
    assert summary["uncached_cost_per_completed_usd"] == "0.000022800"
    assert summary["token_hit_rate"] == 192 / 408

    steps = {
        s["percent"]: (s["shared_words"], s["cached_tokens"])
        for s in data["stages"]["partial"]["steps"]
    }
    assert steps == {0: (0, [0]), 50: (56, [48]), 100: (100, [96])}

    eviction = data["stages"]["eviction"]
    assert [(s["prompts"], s["hit_rate"]) for s in eviction["sizes"]] == [
        (1, 96 / 102), (2, 96 / 102), (4, 96 / 102), (8, 96 / 102), (12, 0.0), (16, 0.0),
    ]  # fmt: skip
    assert (eviction["last_reuse_tokens"], eviction["reuse_gone_tokens"]) == (816, 1224)

    assert json.loads((tmp_path / "report.json").read_text()) == data
    for name in ("ttft_cold_warm.png", "partial.png", "concurrency.png", "eviction.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    markdown = (tmp_path / "report.md").read_text()
    assert "| billed input change | -35.3% |" in markdown
    assert "Reuse disappears between **816** and **1,224** prompt tokens" in markdown
    assert "Isolation" not in markdown.split("## Summary")[0]
