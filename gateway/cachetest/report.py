"""The cache test report: ``report.json`` (every figure) and ``report.md`` with its PNG plots.

The Markdown is written from the same data as the JSON, so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.cachetest import (
    cold_warm,
    concurrency,
    eviction,
    isolation,
    partial,
    plots,
    summary,
)
from gateway.cachetest.figures import usd
from gateway.cachetest.runner import Results
from gateway.replay.report import git_commit, kvgate_version


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


def to_markdown(data: dict[str, Any], images: dict[str, str] | None = None) -> str:
    """The human-readable report."""
    images = images or {}
    stages = data["stages"]
    s = data["summary"]
    lines = [
        "# Cache test",
        "",
        f"Target `{data['target']}`, model `{data['model']}`"
        + (" (kvgate)" if data["kvgate_target"] else "")
        + f"; plan **{data['plan']}**, stages {', '.join(data['stages_run'])}; "
        f"{data['wall_s']:.1f} s.",
        "",
    ]
    if "isolation" in stages:
        iso = stages["isolation"]
        mark = "FAILED" if iso["failed"] else "passed"
        lines += [f"**Isolation {mark}: {iso['verdict']}.**", ""]
    lines += [
        "## Summary",
        "",
        _table(
            ["figure", "value"],
            [
                ["workload", s["workload"]],
                ["token hit rate", _pct(s["token_hit_rate"])],
                [
                    "token hit rate, every request of the first key",
                    _pct(s["all_requests_token_hit_rate"]),
                ],
                [
                    "TTFT p50 cold → warm",
                    f"{_ms(s['ttft_p50_cold_s'])} → {_ms(s['ttft_p50_warm_s'])}",
                ],
                ["TTFT change warm vs cold", _pct(s["ttft_change_warm_vs_cold"], sign=True)],
                [
                    "input cost with cache / without (USD)",
                    f"{_usd(s['input_cost_usd'])} / {_usd(s['uncached_input_cost_usd'])}",
                ],
                ["billed input change", _pct(s["billed_input_change"], sign=True)],
                [
                    "input change, warm pass vs cold pass",
                    _pct(s["warm_vs_cold_input_change"], sign=True),
                ],
                [
                    "cost per completed interaction, with / without (USD)",
                    f"{_usd(s['cost_per_completed_usd'])} / "
                    f"{_usd(s['uncached_cost_per_completed_usd'])}",
                ],
                [
                    "cost per completed interaction change",
                    _pct(s["cost_per_completed_change"], sign=True),
                ],
            ],
        ),
        "",
    ]
    price = data["price_usd_per_million"]
    if price is None:
        lines += ["No price: pass --price-input/--price-cache-read/--price-output for costs.", ""]
    else:
        lines += [
            f"Price ({data['price_source']}), USD per million tokens: input {price['input']}, "
            f"cache read {price['cache_read']}, output {price['output']}. Input cost = uncached "
            "× input + cached × cache read; without cache = every prompt token at input.",
            "",
        ]
    billed = s["kvgate_statement"]
    if billed is not None:
        agree = "matches" if billed["matches_usage"] else "does NOT match"
        lines += [
            f"kvgate's statement for the run (first key): {billed['requests']} requests, "
            f"{billed['cache_read_tokens']:,} cached tokens, input {billed['cost_input_usd']} "
            f"USD, total {billed['cost_total_usd']} USD; it {agree} the usage the endpoint "
            "reported.",
            "",
        ]
    for name, render in (
        ("cold-warm", _cold_warm),
        ("partial", _partial),
        ("concurrency", _concurrency),
        ("eviction", _eviction),
        ("isolation", _isolation),
    ):
        if name in stages:
            lines += render(stages[name], data)
            if name in images:
                lines += [f"![{name}]({images[name]})", ""]
    lines += [
        "## Setup",
        "",
        f"- prompts of {data['prompt_words']:,} words (about one token each), "
        f"{data['max_tokens']} output tokens, seed {data['seed']}",
        f"- block size {data['block_size']} ({data['block_size_source']})"
        + (
            f"; the target's cache: {data['target_cache_blocks']:,} blocks"
            if data["target_cache_blocks"]
            else ""
        ),
        f"- cache_salt per key: {'yes' if data['salt_per_key'] else 'no'}",
        f"- stage times: {', '.join(f'{k} {v:.1f} s' for k, v in data['stage_wall_s'].items())}",
        f"- kvgate {data['kvgate']['version']}, commit `{data['kvgate']['commit']}`",
        "",
        "Every figure, and every request, is in `report.json`.",
        "",
    ]
    return "\n".join(lines)


def _cold_warm(stage: dict[str, Any], data: dict[str, Any]) -> list[str]:
    rows = []
    for name in ("cold", "warm"):
        p = stage[name]
        rows.append(
            [
                name,
                f"{p['requests']}",
                f"{p['prompt_tokens']:,}",
                f"{p['cached_tokens']:,}",
                _pct(p["token_hit_rate"]),
                _ms(p["ttft_s"]["p50"]),
                _ms(p["ttft_s"]["p90"]),
                _usd(p["input_cost_usd"]),
                f"{p['errors']}",
            ]
        )
    return [
        "## 1. Cold vs warm",
        "",
        f"{stage['prompts']} distinct prompts, each sent cold and then warm. A warm repeat "
        f"can hit at most {stage['warm_expected_cached_tokens']:,} tokens in all (every full "
        "block but the one holding the last prompt token).",
        "",
        _table(
            [
                "pass",
                "requests",
                "prompt tokens",
                "cached",
                "hit rate",
                "TTFT p50",
                "TTFT p90",
                "input cost (USD)",
                "errors",
            ],
            rows,
        ),
        "",
    ]


def _partial(stage: dict[str, Any], data: dict[str, Any]) -> list[str]:
    rows = [
        [
            f"{st['percent']}%",
            f"{st['shared_words']}",
            ", ".join(str(v) for v in st["cached_tokens"]),
            ", ".join(str(v) for v in st["expected_cached_tokens"]),
            "yes" if st["matches"] else "NO",
            _ms(st["ttft_p50_s"]),
        ]
        for st in stage["steps"]
    ]
    return [
        "## 2. Partial matches",
        "",
        f"A base prompt of {stage['words']:,} words, then probes sharing its first k% "
        f"(moved to mid-block) and diverging after. Expected = full blocks of "
        f"{data['block_size']} tokens in the shared part (one token per word; at 100% the "
        "last prompt token's block is never cached).",
        "",
        _table(["k", "shared words", "cached tokens", "expected", "match", "TTFT p50"], rows),
        "",
        f"All steps match: **{'yes' if stage['all_match'] else 'no'}**.",
        "",
    ]


def _concurrency(stage: dict[str, Any], data: dict[str, Any]) -> list[str]:
    rows = [
        [
            f"{lv['clients']}",
            f"{lv['requests']}",
            _pct(lv["token_hit_rate"]),
            _ms(lv["ttft_s"]["p50"]),
            _ms(lv["ttft_s"]["p99"]),
            f"{lv['errors']}",
            f"{lv['requests_per_s']:.1f}" if lv["requests_per_s"] else "-",
        ]
        for lv in stage["levels"]
    ]
    return [
        "## 3. Concurrency",
        "",
        f"Prompts of a shared prefix ({stage['prefix_words']:,} words, fresh at each level) "
        f"and a suffix of their own ({stage['suffix_words']:,} words).",
        "",
        _table(
            ["clients", "requests", "hit rate", "TTFT p50", "TTFT p99", "errors", "req/s"], rows
        ),
        "",
    ]


def _eviction(stage: dict[str, Any], data: dict[str, Any]) -> list[str]:
    rows = [
        [
            f"{s['prompts']}",
            f"{s['tokens']:,}",
            f"{s['blocks']:,}",
            _pct(s["hit_rate"]),
            "gone" if s["gone"] else "reused",
        ]
        for s in stage["sizes"]
    ]
    gone, last = stage["reuse_gone_tokens"], stage["last_reuse_tokens"]
    if gone is None:
        where = "Reuse did not disappear up to the largest working set tried."
    else:
        where = (
            f"Reuse disappears between **{last or 0:,}** and **{gone:,}** prompt tokens of "
            "working set."
        )
    return [
        "## 4. Eviction",
        "",
        "Working sets of distinct prompts, sent once and then revisited in the same order. "
        f"Reuse is gone when the revisit hit rate is under {stage['gone_share']:.0%} of the "
        "smallest working set's.",
        "",
        _table(["prompts", "tokens", "blocks", "revisit hit rate", ""], rows),
        "",
        where,
        "",
    ]


def _isolation(stage: dict[str, Any], data: dict[str, Any]) -> list[str]:
    audit, control = stage["audit"], stage["control"]
    t = stage["ttft_s"]

    def test_row(name: str, test: dict[str, Any] | None, x: str, y: str) -> list[str]:
        if test is None:
            return [name, "-", "-", "-", "-", "-", "-"]
        return [
            name,
            f"{test['n_x']} / {test['n_y']}",
            _ms(t[x]["p50"]),
            _ms(t[y]["p50"]),
            f"{test['p_value']:.3g}",
            f"{test['rank_biserial']:.3f}",
            f"{test['cles']:.3f}",
        ]

    leaked = stage["leaked_cached_tokens"]
    lines = [
        "## 5. Tenant isolation",
        "",
        "The second key sends the first key's exact prompts and as many fresh prompts of the "
        "same length, interleaved at random. Timing audit: one-sided Mann-Whitney U "
        f"(warmed faster than fresh); sharing when p < {stage['alpha']} and the rank-biserial "
        f"effect ≥ {stage['min_effect']}. The control is the first key's own warm vs cold "
        "TTFT: it shows whether the cache can be seen in TTFT on this endpoint at all.",
        "",
        _table(
            ["test", "n", "TTFT p50 (x)", "TTFT p50 (y)", "p-value", "rank-biserial", "CLES"],
            [
                test_row("audit: warmed (x) vs fresh (y)", audit, "warmed", "fresh"),
                test_row("control: warm (x) vs cold (y)", control, "control_warm", "control_cold"),
            ],
        ),
        "",
        "- cached tokens the second key got from the first key's prompts: "
        + ("withheld from the auditor (timing only)" if leaked is None else f"{leaked:,}"),
        f"- timing evidence of sharing: {'yes' if stage['evidence']['timing'] else 'no'}",
        f"- verdict: **{stage['verdict']}**",
    ]
    if not stage["control_detectable"]:
        lines.append(
            "- warning: the control shows no measurable speed-up from the cache on this "
            "endpoint, so the timing audit had little power"
        )
    return [*lines, ""]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(row) + " |" for row in lines)


def _pct(value: float | None, *, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f}%" if sign else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.1f} ms"


def _usd(value: str | None) -> str:
    return "-" if value is None else value


def _mean(values: Sequence[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def _mean_share(step: dict[str, Any], words: int) -> float:
    return 100 * (step["shared_words"] or 0) / words if words else 0.0
