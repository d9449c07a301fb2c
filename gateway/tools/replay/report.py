"""The replay report: ``report.md`` (tables), ``report.json``, PNG plots and per-request CSVs.

A report carries its own context (trace, fleet, cache definition, eviction, timing,
tunables, kvgate version and git commit) so that a number read later can be reproduced.
"""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from gateway.routing.policy import Tunables
from gateway.tools.replay import plots
from gateway.tools.replay.analysis import Distribution, TraceAnalysis
from gateway.tools.replay.metrics import PolicySummary
from gateway.tools.replay.offline import PolicyRun
from gateway.tools.replay.trace import TraceRequest
from gateway.tools.sim.timing import TimingModel
from pricing.book import Rates

CACHE_DEFINITION = (
    "token hit rate = cached prompt tokens / prompt tokens, token-weighted over all "
    "requests; a token is cached when its whole block (of block_tokens) was held by the "
    "replica when the request was scheduled; only full blocks count, and as in vLLM the "
    "last prompt token is always computed"
)
EVICTION = (
    "vLLM's prefix cache (gateway.tools.sim.cache.PrefixCache): blocks of running requests are "
    "pinned; freed blocks join an LRU queue, a request's tail first; a new block evicts "
    "the least recently freed block"
)
ROUTER = (
    "the gateway's own placement (gateway.routing.placement): views with the hit capped "
    "where vLLM caps it, in-flight and queued-prefill accounting, capacity = max_num_seqs, "
    "learning from reported cached tokens; ties broken by the hashed request id (the "
    "request's position in the trace when it has no ids) and the replica's name"
)
# The code whose changes would change a replay's numbers.
REPLAY_CODE = ("gateway/routing", "gateway/tools/replay", "gateway/tools/sim")
CEILING_DEFINITION = (
    "infinite-cache ceiling: share of prompt tokens whose block and every block before it "
    "had been seen earlier in the trace (one pool, nothing ever evicted); pooled ceiling: "
    "one LRU PrefixCache of replicas x capacity blocks fed the requests in order"
)


@dataclass(frozen=True, slots=True)
class ReportContext:
    """How the numbers were made."""

    trace: str
    replicas: int
    capacity_blocks: int
    block_tokens: int
    timing: TimingModel
    index: str
    tunables: Tunables
    price: Rates | None
    version: str
    commit: str
    cpu_blocks: int = 0
    disk_blocks: int = 0
    gateways: tuple[int, ...] = (1,)


def kvgate_version() -> str:
    """The installed kvgate's version, or "unknown" when run from a bare checkout."""
    try:
        return metadata.version("kvgate")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_commit(directory: Path) -> str:
    """HEAD's commit, with ``-dirty`` when the code the replay runs differs from it.

    Only the routing, replay and simulator packages are compared: other work in progress
    in the same checkout does not change the numbers.
    """
    try:
        head = _git(directory, "rev-parse", "HEAD")
        top = _git(directory, "rev-parse", "--show-toplevel")
        dirty = _git(Path(top), "status", "--porcelain", "--", *REPLAY_CODE)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def _git(directory: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=directory, capture_output=True, text=True, check=True, timeout=10
    )
    return done.stdout.strip()


def policy_table(summaries: Sequence[PolicySummary], *, priced: bool = False) -> str:
    """The per-policy results as a Markdown table."""
    header = [
        "policy",
        "token hit rate",
        "efficiency",
        "TTFT p50 (s)",
        "TTFT p90 (s)",
        "TTFT p99 (s)",
        "queue mean (s)",
        "queue p99 (s)",
        "max/mean load",
        "prefill tokens",
    ]
    if priced:
        header += ["input cost (USD)", "cost/request (USD)"]
    rows = [header, ["---"] * len(header)]
    for s in summaries:
        row = [
            s.policy,
            f"{100 * s.token_hit_rate:.2f}%",
            f"{100 * s.efficiency:.1f}%",
            f"{s.ttft_p50_s:.2f}",
            f"{s.ttft_p90_s:.2f}",
            f"{s.ttft_p99_s:.2f}",
            f"{s.queue_mean_s:.2f}",
            f"{s.queue_p99_s:.2f}",
            f"{s.max_mean_load:.2f}",
            f"{s.prefill_tokens:,}",
        ]
        if priced:
            row += [f"{s.input_cost_usd}", f"{s.cost_per_request_usd}"]
        rows.append(row)
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def tier_table(summaries: Sequence[PolicySummary], analysis: TraceAnalysis) -> str:
    """Hit rate by tier, TTFT and prefill saved, against the ceilings, per policy."""
    pooled = analysis.pooled_tiers or analysis.pooled
    header = [
        "policy",
        "token hit rate",
        "GPU",
        "host memory",
        "disk",
        "of pooled (all tiers)",
        "efficiency",
        "TTFT p50 (s)",
        "TTFT p99 (s)",
        "prefill saved (tokens)",
    ]
    rows = [header, ["---"] * len(header)]
    for s in summaries:
        rows.append(
            [
                s.policy,
                f"{100 * s.token_hit_rate:.2f}%",
                f"{100 * s.tier_rate(0):.2f}%",
                f"{100 * s.tier_rate(1):.2f}%",
                f"{100 * s.tier_rate(2):.2f}%",
                f"{100 * s.token_hit_rate / pooled.rate:.1f}%" if pooled.rate else "-",
                f"{100 * s.efficiency:.1f}%",
                f"{s.ttft_p50_s:.2f}",
                f"{s.ttft_p99_s:.2f}",
                f"{s.cached_tokens:,}",
            ]
        )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def gateways_table(summaries: Sequence[PolicySummary]) -> str:
    """Hit rate per policy and number of gateway instances, with the loss against one."""
    header = ["policy", "gateways", "token hit rate", "loss (points)", "efficiency", "TTFT p99 (s)"]
    rows = [header, ["---"] * len(header)]
    single = {s.policy: s.token_hit_rate for s in summaries if s.gateways == 1}
    for s in summaries:
        base = single.get(s.policy)
        loss = "-" if base is None else f"{100 * (base - s.token_hit_rate):.2f}"
        rows.append(
            [
                s.policy,
                str(s.gateways),
                f"{100 * s.token_hit_rate:.2f}%",
                loss,
                f"{100 * s.efficiency:.1f}%",
                f"{s.ttft_p99_s:.2f}",
            ]
        )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def to_json(
    context: ReportContext, analysis: TraceAnalysis, summaries: Sequence[PolicySummary]
) -> dict[str, Any]:
    """The report as JSON-ready data; rates are fractions, money is a decimal string."""
    return {
        "requests": analysis.requests,
        "ceiling": analysis.ceiling.rate,
        "pooled_ceiling": analysis.pooled.rate,
        "pooled_tiers_ceiling": None
        if analysis.pooled_tiers is None
        else analysis.pooled_tiers.rate,
        "policies": {_name(s): _policy_json(s) for s in summaries},
        "trace": {
            "path": context.trace,
            "prompt_tokens": analysis.ceiling.prompt_tokens,
            "ceiling_cached_tokens": analysis.ceiling.cached_tokens,
            "pooled_cached_tokens": analysis.pooled.cached_tokens,
            "pooled_capacity_blocks": analysis.pooled_capacity_blocks,
            "prompt_lengths": _distribution_json(analysis.prompt_lengths),
            "repeat_intervals_s": _distribution_json(analysis.repeat_intervals),
        },
        "fleet": {
            "replicas": context.replicas,
            "capacity_blocks": context.capacity_blocks,
            "block_tokens": context.block_tokens,
            "index": context.index,
            "cpu_blocks": context.cpu_blocks,
            "disk_blocks": context.disk_blocks,
            "gateways": list(context.gateways),
            "router": ROUTER,
            "eviction": EVICTION,
            "timing": asdict(context.timing),
            "tunables": asdict(context.tunables),
        },
        "definitions": {"cache": CACHE_DEFINITION, "ceiling": CEILING_DEFINITION},
        "price_usd_per_million": None if context.price is None else context.price.to_mapping(),
        "kvgate": {"version": context.version, "commit": context.commit},
    }


def to_markdown(
    context: ReportContext, analysis: TraceAnalysis, summaries: Sequence[PolicySummary]
) -> str:
    """The human-readable report."""
    timing = context.timing
    t = context.tunables
    lines = [
        "# Routing replay",
        "",
        f"Trace `{context.trace}`: {analysis.requests:,} requests, "
        f"{analysis.ceiling.prompt_tokens:,} prompt tokens.",
        "",
        f"- infinite-cache ceiling: **{100 * analysis.ceiling.rate:.2f}%**",
        f"- pooled ceiling ({analysis.pooled_capacity_blocks:,} blocks in one LRU cache): "
        f"**{100 * analysis.pooled.rate:.2f}%**",
        "",
        policy_table(summaries, priced=context.price is not None),
        "",
        "Efficiency = token hit rate / infinite-cache ceiling. Max/mean load = the busiest "
        "replica's prefill tokens over the mean. Queue = arrival to prefill start.",
        "",
        *_tier_lines(context, analysis, summaries),
        *_gateway_lines(context, summaries),
        "![hit rate](hit_rate.png)",
        "![TTFT](ttft.png)",
        "![load](load.png)",
        "![trace](trace.png)",
        "",
        "## Setup",
        "",
        f"- fleet: {context.replicas} replicas x {context.capacity_blocks:,} blocks of "
        f"{context.block_tokens} tokens",
        f"- router: {ROUTER}; its block index: {context.index}",
        f"- kv-aware tunables: load_weight={t.load_weight}, running_tokens={t.running_tokens},"
        f" imbalance_factor={t.imbalance_factor}, "
        f"imbalance_floor_tokens={t.imbalance_floor_tokens}",
        f"- timing: prefill {timing.prefill_tokens_per_s:g} uncached tokens/s, one prefill "
        f"at a time in order; decode {timing.decode_tokens_per_s:g} tokens/s per sequence; "
        f"at most {timing.max_num_seqs} sequences per replica",
        f"- eviction: {EVICTION}",
        f"- cache definition: {CACHE_DEFINITION}",
        f"- ceilings: {CEILING_DEFINITION}",
        f"- kvgate {context.version}, commit `{context.commit}`",
    ]
    if context.price is not None:
        p = context.price
        lines.append(
            f"- price (USD per million tokens): input {p.input}, cache read {p.cache_read}, "
            f"output {p.output}; input cost = uncached x input + cached x cache read"
        )
    lines += [
        "",
        "## Trace shape",
        "",
        _distribution_table(
            ("prompt tokens", analysis.prompt_lengths),
            ("repeat interval (s)", analysis.repeat_intervals),
        ),
        "",
        "Repeat interval: time between two uses of the same block, over every reuse.",
        "",
        "Per-request rows: `requests-<policy>.csv`.",
        "",
    ]
    return "\n".join(lines)


def _tier_lines(
    context: ReportContext, analysis: TraceAnalysis, summaries: Sequence[PolicySummary]
) -> list[str]:
    if analysis.pooled_tiers is None:
        return []
    t = context.timing
    return [
        "## Cache tiers",
        "",
        f"Per replica: {context.capacity_blocks:,} GPU blocks, {context.cpu_blocks:,} in host "
        f"memory ({t.cpu_block_ms:g} ms a block to load), {context.disk_blocks:,} on disk "
        f"({t.disk_block_ms:g} ms). Pooled ceiling of the combined capacity "
        f"({analysis.pooled_tiers_capacity_blocks:,} blocks in one LRU cache): "
        f"**{100 * analysis.pooled_tiers.rate:.2f}%**.",
        "",
        tier_table([s for s in summaries if s.gateways == 1], analysis),
        "",
    ]


def _gateway_lines(context: ReportContext, summaries: Sequence[PolicySummary]) -> list[str]:
    if context.gateways == (1,):
        return []
    return [
        "## Gateway instances",
        "",
        "K independent instances behind a round-robin balancer, each with its own index "
        "and in-flight counts, reading the replicas' load every second.",
        "",
        gateways_table(summaries),
        "",
    ]


def write_report(
    directory: Path,
    *,
    context: ReportContext,
    analysis: TraceAnalysis,
    requests: Sequence[TraceRequest],
    runs: Sequence[PolicyRun],
    summaries: Sequence[PolicySummary],
) -> None:
    """Write report.md, report.json, the plots and one CSV per policy into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.md").write_text(to_markdown(context, analysis, summaries))
    data = to_json(context, analysis, summaries)
    (directory / "report.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    for run in runs:
        suffix = "" if run.config.gateways == 1 else f"@{run.config.gateways}"
        write_csv(directory / f"requests-{run.policy}{suffix}.csv", run)
    # The plots compare policies: one run each (the first gateway count's).
    first = summaries[0].gateways if summaries else 1
    plots.hit_rates(
        directory / "hit_rate.png", [s for s in summaries if s.gateways == first], analysis
    )
    plots.ttft(directory / "ttft.png", [r for r in runs if r.config.gateways == first])
    plots.load(directory / "load.png", [r for r in runs if r.config.gateways == first])
    plots.trace_shape(directory / "trace.png", requests)


def write_csv(path: Path, run: PolicyRun) -> None:
    """One row per request: arrival, replica, tokens, cached tokens, queueing, TTFT."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(
            [
                "arrival_s",
                "replica",
                "prompt_tokens",
                "cached_tokens",
                "predicted_cached_tokens",
                "output_tokens",
                "queue_s",
                "ttft_s",
            ]
        )
        for o in run.outcomes:
            writer.writerow(
                [
                    f"{o.arrival_s:.3f}",
                    o.replica,
                    o.prompt_tokens,
                    o.cached_tokens,
                    o.predicted_cached_tokens,
                    o.output_tokens,
                    f"{o.queue_s:.6f}",
                    f"{o.ttft_s:.6f}",
                ]
            )


# A summary's fields the report's JSON holds as they are, under their own names, in order.
_POLICY_FIELDS = (
    "token_hit_rate",
    "efficiency",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "queue_mean_s",
    "queue_p99_s",
    "max_mean_load",
    "prefill_tokens",
    "prompt_tokens",
    "cached_tokens",
    "predicted_cached_tokens",
)


def _policy_json(s: PolicySummary) -> dict[str, Any]:
    return {
        **{name: getattr(s, name) for name in _POLICY_FIELDS},
        "cached_tokens_by_tier": {
            "gpu": s.cached_by_tier[0],
            "host": s.cached_by_tier[1],
            "disk": s.cached_by_tier[2],
        },
        "gateways": s.gateways,
        "prefill_tokens_per_replica": list(s.prefill_tokens_per_replica),
        "requests_per_replica": list(s.requests_per_replica),
        "input_cost_usd": None if s.input_cost_usd is None else str(s.input_cost_usd),
        "cost_per_request_usd": (
            None if s.cost_per_request_usd is None else str(s.cost_per_request_usd)
        ),
    }


def _name(s: PolicySummary) -> str:
    """A policy's key in the report: its name, with the gateway count past one."""
    return s.policy if s.gateways == 1 else f"{s.policy}@{s.gateways}"


def _distribution_json(d: Distribution) -> dict[str, Any]:
    return {
        "count": d.count,
        "mean": d.mean,
        "min": d.minimum,
        "max": d.maximum,
        **{f"p{q}": v for q, v in d.quantiles},
    }


def _distribution_table(*named: tuple[str, Distribution]) -> str:
    percents = [q for q, _ in named[0][1].quantiles]
    header = ["", "count", "mean", "min", *[f"p{q}" for q in percents], "max"]
    rows = [header, ["---"] * len(header)]
    for name, d in named:
        rows.append(
            [
                name,
                f"{d.count:,}",
                f"{d.mean:,.1f}",
                f"{d.minimum:,.1f}",
                *[f"{v:,.1f}" for _, v in d.quantiles],
                f"{d.maximum:,.1f}",
            ]
        )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)
