"""JSON-ready figures shared by the stages: TTFT percentiles, spends, single requests.

Rates are fractions, times are seconds, money is a decimal string (never a float).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from gateway.tools.cachetest.client import Outcome
from gateway.tools.cachetest.costs import Spend, input_cost
from gateway.tools.cachetest.stats import RankTest, percentile
from pricing.book import Rates


def ttfts(outcomes: Iterable[Outcome]) -> list[float]:
    """TTFTs of the completed requests that produced a token."""
    return [o.ttft_s for o in outcomes if o.ok and o.ttft_s is not None]


def ttft_json(values: Sequence[float]) -> dict[str, Any]:
    """Count, mean and percentiles of a TTFT sample."""
    return {
        "count": len(values),
        "mean": sum(values) / len(values) if values else None,
        "min": min(values) if values else None,
        "p50": percentile(values, 50) if values else None,
        "p90": percentile(values, 90) if values else None,
        "p99": percentile(values, 99) if values else None,
        "max": max(values) if values else None,
    }


def usd(value: Decimal | None) -> str | None:
    """Money as a decimal string."""
    return None if value is None else f"{value:f}"


def spend_json(s: Spend) -> dict[str, Any]:
    """A spend's tokens and money."""
    return {
        "requests": s.requests,
        "completed": s.completed,
        "errors": s.requests - s.completed,
        "prompt_tokens": s.prompt_tokens,
        "cached_tokens": s.cached_tokens,
        "output_tokens": s.output_tokens,
        "token_hit_rate": s.token_hit_rate,
        "input_cost_usd": usd(s.input_cost),
        "uncached_input_cost_usd": usd(s.uncached_input_cost),
        "output_cost_usd": usd(s.output_cost),
        "cost_per_completed_usd": usd(s.cost_per_completed),
        "uncached_cost_per_completed_usd": usd(s.uncached_cost_per_completed),
    }


def outcome_json(o: Outcome, price: Rates | None = None) -> dict[str, Any]:
    """One request."""
    row: dict[str, Any] = {
        "status": o.status,
        "prompt_tokens": o.prompt_tokens,
        "cached_tokens": o.cached_tokens,
        "output_tokens": o.output_tokens,
        "ttft_s": o.ttft_s,
        "latency_s": o.latency_s,
        "error": o.error,
    }
    if price is not None:
        row["input_cost_usd"] = usd(input_cost(o, price))
    return row


def rank_test_json(test: RankTest | None) -> dict[str, Any] | None:
    """A Mann-Whitney test's numbers."""
    if test is None:
        return None
    return {
        "n_x": test.n_x,
        "n_y": test.n_y,
        "u_x": test.u_x,
        "z": test.z,
        "p_value": test.p_value,
        "cles": test.cles,
        "rank_biserial": test.rank_biserial,
    }
