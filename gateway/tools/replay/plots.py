"""The replay report's figures, drawn with matplotlib's Agg backend (no display needed).

matplotlib is imported inside each function: it is a report-time dependency only, and
importing it costs half a second that nothing else in the gateway should pay.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.tools.replay.analysis import TraceAnalysis, repeat_gaps
from gateway.tools.replay.metrics import PolicySummary
from gateway.tools.replay.offline import PolicyRun
from gateway.tools.replay.trace import TraceRequest

# The load plot shows minutes, not the 10-second samples: 8 lines of raw samples are noise.
LOAD_BIN_S = 60.0


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def hit_rates(path: Path, summaries: Sequence[PolicySummary], analysis: TraceAnalysis) -> None:
    """Token hit rate per policy, against the infinite and pooled ceilings."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [s.policy for s in summaries]
    rates = [100 * s.token_hit_rate for s in summaries]
    bars = ax.bar(names, rates, color="#4c72b0")
    ax.bar_label(bars, labels=[f"{r:.1f}%" for r in rates], padding=2)
    ax.axhline(
        100 * analysis.ceiling.rate,
        color="#c44e52",
        linestyle="--",
        label=f"infinite-cache ceiling {100 * analysis.ceiling.rate:.2f}%",
    )
    ax.axhline(
        100 * analysis.pooled.rate,
        color="#dd8452",
        linestyle=":",
        label=f"pooled ceiling {100 * analysis.pooled.rate:.2f}%",
    )
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(0, max([*rates, 100 * analysis.ceiling.rate]) * 1.2)
    ax.set_title("Prefix-cache hit rate by routing policy")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ttft(path: Path, runs: Sequence[PolicyRun]) -> None:
    """Distribution (CDF) of time to first token per policy."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        values = sorted(max(o.ttft_s, 1e-3) for o in run.outcomes)
        if not values:
            continue
        shares = [(i + 1) / len(values) for i in range(len(values))]
        ax.plot(values, shares, label=run.policy)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s, log scale)")
    ax.set_ylabel("share of requests")
    ax.set_title("TTFT distribution by routing policy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load(path: Path, runs: Sequence[PolicyRun]) -> None:
    """Requests in flight per replica over time, one panel per policy (minute means)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.2 * len(runs)), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        bins: dict[int, list[tuple[int, ...]]] = {}
        for sample in run.load:
            bins.setdefault(int(sample.time_s // LOAD_BIN_S), []).append(sample.in_flight)
        minutes = sorted(bins)
        for replica in range(run.config.replicas):
            means = [sum(s[replica] for s in bins[m]) / len(bins[m]) for m in minutes]
            ax.plot([m * LOAD_BIN_S / 60 for m in minutes], means, linewidth=1)
        ax.set_title(run.policy, fontsize="small", loc="left")
        ax.set_ylabel("in flight")
    axes[-1, 0].set_xlabel("minutes into the trace")
    fig.suptitle("Load per replica over time (one line per replica)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def trace_shape(path: Path, requests: Sequence[TraceRequest]) -> None:
    """Histograms of prompt length and of the interval between uses of the same block."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.hist([r.input_length for r in requests], bins=60, color="#4c72b0")
    left.set_xlabel("prompt tokens")
    left.set_ylabel("requests")
    left.set_title("Prompt length")
    # Reuses within the same millisecond are drawn at 1 ms: a log axis has no zero.
    gaps = [max(gap, 1e-3) for gap in repeat_gaps(requests)]
    if gaps:
        edges = [10 ** (e / 10) for e in range(-30, 36)]
        right.hist(gaps, bins=edges, color="#55a868")
        right.set_xscale("log")
    right.set_xlabel("seconds between uses of the same block (log; same instant at 1 ms)")
    right.set_ylabel("reuses")
    right.set_title("Repeat interval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
