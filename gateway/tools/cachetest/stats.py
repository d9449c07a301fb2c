"""The timing audit's statistics: the Mann-Whitney U test and its effect sizes, in plain Python.

One-sided: is sample ``x`` (TTFTs of prompts another key warmed) stochastically smaller
than sample ``y`` (TTFTs of fresh prompts of the same length)? Ranks are averaged over
ties; the variance carries the tie correction; the p-value is the normal approximation
with a continuity correction (scipy's ``mannwhitneyu(x, y, alternative="less",
method="asymptotic")`` gives the same numbers, but scipy is not a dependency).

Effect sizes, both read from U: the common-language effect size P(x < y) + P(x = y) / 2
(0.5: no difference, 1: every x below every y), and the rank-biserial correlation
2 * CLES - 1 (0: none, 1: complete separation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.tools.replay.metrics import percentile

__all__ = ["RankTest", "mann_whitney_less", "normal_cdf", "percentile", "ranks"]


@dataclass(frozen=True, slots=True)
class RankTest:
    """The outcome of a one-sided Mann-Whitney U test that x is smaller than y."""

    n_x: int
    n_y: int
    u_x: float  # pairs with x above y, ties counting one half
    z: float
    p_value: float
    cles: float  # P(x < y) + P(x = y) / 2
    rank_biserial: float  # 2 * cles - 1

    def significant(self, *, alpha: float, min_effect: float) -> bool:
        """Both: p below alpha, and a rank-biserial effect of at least ``min_effect``."""
        return self.p_value < alpha and self.rank_biserial >= min_effect


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, tied values sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        mean_rank = (start + end) / 2 + 1
        for position in range(start, end + 1):
            out[order[position]] = mean_rank
        start = end + 1
    return out


def normal_cdf(z: float) -> float:
    """The standard normal distribution function, accurate far into the lower tail."""
    return 0.5 * math.erfc(-z / math.sqrt(2))


def mann_whitney_less(x: Sequence[float], y: Sequence[float]) -> RankTest:
    """Test whether x tends to be smaller than y (normal approximation, tie-corrected)."""
    n_x, n_y = len(x), len(y)
    if n_x == 0 or n_y == 0:
        raise ValueError("both samples need at least one value")
    combined = [*x, *y]
    rank = ranks(combined)
    u_x = sum(rank[:n_x]) - n_x * (n_x + 1) / 2
    pairs = n_x * n_y
    n = n_x + n_y
    counts: dict[float, int] = {}
    for value in combined:
        counts[value] = counts.get(value, 0) + 1
    ties = sum(t**3 - t for t in counts.values())
    variance = pairs / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    mean = pairs / 2
    if variance <= 0:
        # Every value equal: no evidence either way.
        z, p_value = 0.0, 1.0
    else:
        # Continuity correction: half a unit of U towards the mean.
        z = (u_x - mean + 0.5) / math.sqrt(variance)
        p_value = min(1.0, normal_cdf(z))
    cles = 1 - u_x / pairs
    return RankTest(n_x, n_y, u_x, z, p_value, cles, 2 * cles - 1)
