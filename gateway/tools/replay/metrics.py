"""What a replay run achieved: hit rate, efficiency, latency, balance, prefill work, cost.

Definitions (DESIGN.md): token hit rate = cached tokens / prompt tokens, token-weighted,
cached tokens counting full blocks only; routing efficiency = hit rate / hit-rate
ceiling; blended input cost = uncached * input rate + cached * cache-read rate.
Percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from gateway.tools.replay.offline import PolicyRun
from pricing.book import Rates
from pricing.cost import ZERO, money


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """One policy's numbers on one trace."""

    policy: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    predicted_cached_tokens: int
    token_hit_rate: float
    efficiency: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    queue_mean_s: float
    queue_p99_s: float
    prefill_tokens: int
    prefill_tokens_per_replica: tuple[int, ...]
    requests_per_replica: tuple[int, ...]
    max_mean_load: float  # busiest replica's prefill work over the mean
    input_cost_usd: Decimal | None
    cost_per_request_usd: Decimal | None
    cached_by_tier: tuple[int, int, int] = (0, 0, 0)  # tokens: GPU, host memory, disk
    gateways: int = 1

    def tier_rate(self, tier: int) -> float:
        """Token hit rate of one tier (0 GPU, 1 host memory, 2 disk)."""
        return self.cached_by_tier[tier] / self.prompt_tokens if self.prompt_tokens else 0.0


def parse_price(text: str) -> Rates:
    """``"input=X,cache_read=Y,output=Z"`` (USD per million tokens) as `Rates`."""
    fields: dict[str, Decimal] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in ("input", "cache_read", "output"):
            raise ValueError(f"price part {part!r}: want input=X,cache_read=Y,output=Z")
        try:
            fields[name] = Decimal(value.strip())
        except InvalidOperation as error:
            raise ValueError(f"price part {part!r}: {value!r} is not a number") from error
    missing = {"input", "cache_read", "output"} - fields.keys()
    if missing:
        raise ValueError(f"price is missing {', '.join(sorted(missing))}")
    return Rates(**fields)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of values, linear between order statistics."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(run: PolicyRun, *, ceiling: float, price: Rates | None = None) -> PolicySummary:
    """The run's numbers; ``ceiling`` is the trace's infinite-cache hit rate."""
    outcomes = run.outcomes
    replicas = run.config.replicas
    prompt = sum(o.prompt_tokens for o in outcomes)
    cached = sum(o.cached_tokens for o in outcomes)
    predicted = sum(o.predicted_cached_tokens for o in outcomes)
    output = sum(o.output_tokens for o in outcomes)
    prefill = [0] * replicas
    routed = [0] * replicas
    for o in outcomes:
        prefill[o.replica] += o.prompt_tokens - o.cached_tokens
        routed[o.replica] += 1
    by_tier = [0, 0, 0]
    for o in outcomes:
        for tier, tokens in enumerate(o.cached_by_tier):
            by_tier[tier] += tokens
    ttfts = sorted(o.ttft_s for o in outcomes)
    queues = sorted(o.queue_s for o in outcomes)
    hit_rate = cached / prompt if prompt else 0.0
    mean_prefill = sum(prefill) / replicas
    input_cost = cost_per_request = None
    if price is not None:
        input_cost = money(prompt - cached, price.input) + money(cached, price.cache_read)
        total = input_cost + money(output, price.output)
        cost_per_request = (total / len(outcomes)).quantize(ZERO) if outcomes else ZERO
    return PolicySummary(
        policy=run.policy,
        requests=len(outcomes),
        prompt_tokens=prompt,
        cached_tokens=cached,
        predicted_cached_tokens=predicted,
        token_hit_rate=hit_rate,
        efficiency=hit_rate / ceiling if ceiling else 0.0,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        ttft_p99_s=percentile(ttfts, 99),
        queue_mean_s=sum(queues) / len(queues) if queues else 0.0,
        queue_p99_s=percentile(queues, 99),
        prefill_tokens=sum(prefill),
        prefill_tokens_per_replica=tuple(prefill),
        requests_per_replica=tuple(routed),
        max_mean_load=max(prefill) / mean_prefill if mean_prefill else 1.0,
        input_cost_usd=input_cost,
        cost_per_request_usd=cost_per_request,
        cached_by_tier=(by_tier[0], by_tier[1], by_tier[2]),
        gateways=run.config.gateways,
    )
