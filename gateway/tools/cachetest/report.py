"""The cache test report: ``report.json`` (every figure) and ``report.md`` with its PNG plots.

The Markdown is written from the same data as the JSON, so the two never disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gateway.tools.cachetest import (
    cold_warm,
    concurrency,
    eviction,
    isolation,
    partial,
    plots,
    summary,
)
from gateway.tools.cachetest.figures import usd
from gateway.tools.cachetest.markdown import to_markdown
from gateway.tools.cachetest.runner import Results
from gateway.tools.replay.report import git_commit, kvgate_version


def to_json(results: Results) -> dict[str, Any]:
    """Every figure of the run; rates are fractions, times seconds, money decimal strings."""
    config = results.config
    price = results.price
    stages: dict[str, Any] = {}
    if results.cold_warm is not None:
        stages["cold-warm"] = cold_warm.figures(results.cold_warm, price, results.block_size)
    if results.partial is not None:
        stages["partial"] = partial.figures(results.partial)
    if results.concurrency is not None:
        stages["concurrency"] = concurrency.figures(results.concurrency)
    if results.eviction is not None:
        stages["eviction"] = eviction.figures(results.eviction, results.block_size)
    verdict = results.verdict
    if results.isolation is not None and verdict is not None:
        stages["isolation"] = isolation.figures(results.isolation, verdict, config.audit)
    return {
        "target": config.target,
        "model": config.model,
        "kvgate_target": results.kvgate,
        "plan": config.plan.name,
        "stages_run": list(config.stages),
        "prompt_words": config.plan.prompt_words,
        "max_tokens": config.max_tokens,
        "seed": config.seed,
        "salt_per_key": config.salt_per_key,
        "second_key": config.second_key is not None,
        "block_size": results.block_size,
        "block_size_source": results.block_size_source,
        "target_cache_blocks": None if results.cache is None else results.cache.num_blocks,
        "price_usd_per_million": None
        if price is None
        else {
            "input": usd(price.input),
            "cache_read": usd(price.cache_read),
            "output": usd(price.output),
        },
        "price_source": results.price_source,
        "started_at": results.started_at.isoformat(),
        "wall_s": results.wall_s,
        "stage_wall_s": results.stage_wall_s,
        "stages": stages,
        "summary": summary.figures(results),
        "isolation_failed": results.failed,
        "exit_status": 1 if results.failed else 0,
        "kvgate": {"version": kvgate_version(), "commit": git_commit(Path(__file__).parent)},
    }


def write_report(directory: Path, results: Results) -> dict[str, Any]:
    """Write report.json, report.md and the plots; returns the JSON data."""
    directory.mkdir(parents=True, exist_ok=True)
    data = to_json(results)
    (directory / "report.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    images = _plots(directory, data)
    (directory / "report.md").write_text(to_markdown(data, images))
    return data


def _plots(directory: Path, data: dict[str, Any]) -> dict[str, str]:
    stages = data["stages"]
    images: dict[str, str] = {}
    if "cold-warm" in stages:
        rows = stages["cold-warm"]["requests"]
        plots.ttft_cold_warm(
            directory / "ttft_cold_warm.png",
            [r["ttft_s"] for r in rows if r["pass"] == "cold"],
            [r["ttft_s"] for r in rows if r["pass"] == "warm"],
        )
        images["cold-warm"] = "ttft_cold_warm.png"
    if "partial" in stages:
        steps = stages["partial"]["steps"]
        plots.partial_matches(
            directory / "partial.png",
            [_mean_share(s, stages["partial"]["words"]) for s in steps],
            [_mean(s["cached_tokens"]) for s in steps],
            [_mean(s["expected_cached_tokens"]) for s in steps],
            [s["ttft_p50_s"] for s in steps],
        )
        images["partial"] = "partial.png"
    if "concurrency" in stages:
        levels = stages["concurrency"]["levels"]
        plots.concurrency(
            directory / "concurrency.png",
            [lv["clients"] for lv in levels],
            [lv["token_hit_rate"] for lv in levels],
            [lv["ttft_s"]["p50"] for lv in levels],
            [lv["ttft_s"]["p99"] for lv in levels],
        )
        images["concurrency"] = "concurrency.png"
    if "eviction" in stages:
        sizes = stages["eviction"]["sizes"]
        plots.eviction(
            directory / "eviction.png",
            [max(s["tokens"], 1) for s in sizes],
            [s["hit_rate"] for s in sizes],
        )
        images["eviction"] = "eviction.png"
    if "isolation" in stages:
        audit = stages["isolation"]
        rows = audit["requests"]
        plots.audit(
            directory / "audit.png",
            [r["ttft_s"] for r in rows["warmed"] if r["ttft_s"] is not None],
            [r["ttft_s"] for r in rows["fresh"] if r["ttft_s"] is not None],
            f"Second key's TTFT: {audit['verdict']}",
        )
        images["isolation"] = "audit.png"
    return images


def _mean_share(step: dict[str, Any], words: int) -> float:
    return 100 * (step["shared_words"] or 0) / words if words else 0.0


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0
