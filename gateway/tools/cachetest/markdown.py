"""The cache test report in Markdown, written from the report's JSON data (never from the
raw results), so that report.md and report.json cannot disagree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
    audit, control, again = stage["audit"], stage["control"], stage.get("confirmation")

    def test_row(
        name: str, test: dict[str, Any] | None, t: dict[str, Any], x: str, y: str
    ) -> list[str]:
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

    t = stage["ttft_s"]
    rows = [test_row("audit: warmed (x) vs fresh (y)", audit, t, "warmed", "fresh")]
    if again is not None:
        rows.append(
            test_row(
                "confirmation: warmed (x) vs fresh (y)",
                again["audit"],
                again["ttft_s"],
                "warmed",
                "fresh",
            )
        )
    rows.append(
        test_row("control: warm (x) vs cold (y)", control, t, "control_warm", "control_cold")
    )
    if again is None:
        confirmed = "not needed (the audit was not significant)"
    else:
        confirmed = "significant too" if stage["evidence"]["timing"] else "not significant"
    leaked = stage["leaked_cached_tokens"]
    lines = [
        "## 5. Tenant isolation",
        "",
        "The second key sends the first key's exact prompts and as many fresh prompts of the "
        "same length, interleaved at random. Timing audit: one-sided Mann-Whitney U "
        f"(warmed faster than fresh); sharing when p < {stage['alpha']} and the rank-biserial "
        f"effect ≥ {stage['min_effect']}, in the audit and again in a confirmation on new "
        "prompts (run only when the audit is significant). The control is the first key's "
        "own warm vs cold TTFT: it shows whether the cache can be seen in TTFT on this "
        "endpoint at all.",
        "",
        _table(
            ["test", "n", "TTFT p50 (x)", "TTFT p50 (y)", "p-value", "rank-biserial", "CLES"],
            rows,
        ),
        "",
        "- cached tokens the second key got from the first key's prompts: "
        + ("withheld from the auditor (timing only)" if leaked is None else f"{leaked:,}"),
        f"- confirmation: {confirmed}",
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
