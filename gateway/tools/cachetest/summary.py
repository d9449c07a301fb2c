"""Stage 6, the summary: what the cache did for the workload, in a few numbers.

The workload is the cold-vs-warm stage (each prompt used twice) when it ran, else every
request the first key sent. With the cache = as the endpoint reported (cached tokens at the
cache-read rate); without = the same prompts with nothing cached. One request is one
interaction; cost per completed interaction = all cost / completed requests.
"""

from __future__ import annotations

from typing import Any

from gateway.tools.cachetest.costs import change, spend
from gateway.tools.cachetest.figures import spend_json, ttfts, usd
from gateway.tools.cachetest.runner import Results
from gateway.tools.cachetest.stats import percentile


def figures(results: Results) -> dict[str, Any]:
    """The summary's numbers, JSON-ready."""
    price = results.price
    if results.cold_warm is not None:
        name = "cold-warm"
        outcomes = [*results.cold_warm.cold, *results.cold_warm.warm]
        cold_ttft = ttfts(results.cold_warm.cold)
        warm_ttft = ttfts(results.cold_warm.warm)
    else:
        name = "all requests of the first key"
        outcomes = list(results.sent)
        cold_ttft = warm_ttft = []
    workload = spend(outcomes, price)
    everything = spend(results.sent, price)
    cold_p50 = percentile(cold_ttft, 50) if cold_ttft else None
    warm_p50 = percentile(warm_ttft, 50) if warm_ttft else None
    cold_pass = warm_pass = None
    if results.cold_warm is not None:
        cold_pass, warm_pass = results.cold_warm.spends(price)
    billed = results.billed
    return {
        "workload": name,
        "token_hit_rate": workload.token_hit_rate,
        "all_requests_token_hit_rate": everything.token_hit_rate,
        "ttft_p50_cold_s": cold_p50,
        "ttft_p50_warm_s": warm_p50,
        "ttft_change_warm_vs_cold": change(cold_p50, warm_p50),
        "input_cost_usd": usd(workload.input_cost),
        "uncached_input_cost_usd": usd(workload.uncached_input_cost),
        "billed_input_change": change(workload.uncached_input_cost, workload.input_cost),
        "warm_vs_cold_input_change": None
        if cold_pass is None or warm_pass is None
        else change(cold_pass.input_cost, warm_pass.input_cost),
        "cost_per_completed_usd": usd(workload.cost_per_completed),
        "uncached_cost_per_completed_usd": usd(workload.uncached_cost_per_completed),
        "cost_per_completed_change": change(
            workload.uncached_cost_per_completed, workload.cost_per_completed
        ),
        "first_key_requests": spend_json(everything),
        "kvgate_statement": None
        if billed is None
        else {
            "requests": billed.requests,
            "uncached_tokens": billed.uncached_tokens,
            "cache_read_tokens": billed.cache_read_tokens,
            "output_tokens": billed.output_tokens,
            "cost_input_usd": usd(billed.cost_input),
            "cost_total_usd": usd(billed.cost_total),
            "matches_usage": everything.input_cost == billed.cost_input
            and billed.requests == everything.requests,
        },
    }
