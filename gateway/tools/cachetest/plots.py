"""The cache test report's figures (matplotlib, Agg backend, imported only when drawing)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.tools.replay.plots import pyplot

COLD, WARM, EXPECTED, TIME = "#4c72b0", "#dd8452", "#c44e52", "#55a868"


def _save(fig: Any, plt: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ttft_cold_warm(path: Path, cold: Sequence[float | None], warm: Sequence[float | None]) -> None:
    """Each prompt's TTFT cold and warm, side by side (milliseconds)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    index = range(len(cold))
    ax.bar([i - 0.2 for i in index], [1000 * (v or 0) for v in cold], 0.4, color=COLD, label="cold")
    ax.bar([i + 0.2 for i in index], [1000 * (v or 0) for v in warm], 0.4, color=WARM, label="warm")
    ax.set_xticks(list(index))
    ax.set_xlabel("prompt")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title("TTFT cold vs warm, per prompt")
    ax.legend()
    _save(fig, plt, path)


def partial_matches(
    path: Path,
    percents: Sequence[float],
    cached: Sequence[float],
    expected: Sequence[float],
    ttft: Sequence[float | None],
) -> None:
    """Cached tokens (and the full-block expectation) and TTFT against the shared prefix."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(percents, cached, color=COLD, marker="o", label="cached tokens")
    ax.plot(
        percents, expected, color=EXPECTED, linestyle="--", label="expected (full blocks)", zorder=3
    )
    ax.set_xlabel("shared prefix (% of the prompt)")
    ax.set_ylabel("cached tokens")
    ax.set_title("Cached tokens vs shared prefix")
    right = ax.twinx()
    right.plot(percents, [1000 * (t or 0) for t in ttft], color=TIME, marker="s", label="TTFT p50")
    right.set_ylabel("time to first token (ms)")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize="small")
    _save(fig, plt, path)


def eviction(path: Path, tokens: Sequence[int], hit_rates: Sequence[float]) -> None:
    """Revisit hit rate against the working set's size."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(tokens, [100 * r for r in hit_rates], color=COLD, marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("working set (prompt tokens, log scale)")
    ax.set_ylabel("revisit token hit rate (%)")
    ax.set_ylim(-5, 105)
    ax.set_title("Hit rate as the working set grows")
    ax.grid(True, alpha=0.3)
    _save(fig, plt, path)


def concurrency(
    path: Path,
    clients: Sequence[int],
    hit_rates: Sequence[float],
    p50: Sequence[float | None],
    p99: Sequence[float | None],
) -> None:
    """Hit rate and TTFT percentiles against concurrent clients."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [str(c) for c in clients]
    left.bar(labels, [100 * r for r in hit_rates], color=COLD)
    left.set_xlabel("concurrent clients")
    left.set_ylabel("token hit rate (%)")
    left.set_ylim(0, 105)
    right.plot(labels, [1000 * (v or 0) for v in p50], marker="o", label="p50", color=COLD)
    right.plot(labels, [1000 * (v or 0) for v in p99], marker="o", label="p99", color=WARM)
    right.set_xlabel("concurrent clients")
    right.set_ylabel("time to first token (ms)")
    right.legend()
    fig.suptitle("Shared-prefix workload under concurrency")
    _save(fig, plt, path)


def audit(path: Path, warmed: Sequence[float], fresh: Sequence[float], title: str) -> None:
    """The second key's TTFT on prompts the first key warmed and on fresh ones (CDFs)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    every = [1000 * v for v in (*warmed, *fresh)]
    low, high = (min(every), max(every)) if every else (0.0, 1.0)
    edges = [low + (high - low) * i / 30 for i in range(31)] if high > low else 30
    for values, label, color in ((fresh, "fresh", COLD), (warmed, "warmed by the first key", WARM)):
        ms = sorted(1000 * v for v in values)
        if not ms:
            continue
        left.hist(ms, bins=edges, alpha=0.6, color=color, label=label)
        right.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], color=color, label=label)
    left.set_xlabel("time to first token (ms)")
    left.set_ylabel("requests")
    right.set_xlabel("time to first token (ms)")
    right.set_ylabel("share of requests")
    right.legend(fontsize="small")
    fig.suptitle(title)
    _save(fig, plt, path)
