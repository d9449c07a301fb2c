"""What a trace allows, before any routing: hit-rate ceilings and the shape of its reuse.

- infinite-cache ceiling: one pool that never forgets (`HitCeiling`), token-weighted; a
  block counts when it and every block before it were seen earlier in the trace. As in
  the trace's own README a seen last block counts its actual tokens even when partial,
  so the ceiling slightly exceeds what full-block caching can reach (34.72% vs 34.70%
  on the shared Mooncake trace).
- pooled ceiling: one LRU `PrefixCache` holding ``replicas x capacity`` blocks, fed the
  requests one after another (admitted, then released): what the fleet's memory could
  hit if it were one cache behind a perfect router. Full blocks, vLLM's hit cap. With
  lower tiers, also the pooled ceiling of the combined capacity: one LRU cache of every
  tier's blocks of every replica.
- prompt lengths, and repeat intervals: the time between two uses of the same block,
  which says how long a cache must keep a block for it to be hit again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.routing.ceiling import HitCeiling
from gateway.tools.replay.metrics import percentile
from gateway.tools.replay.trace import MOONCAKE_BLOCK_TOKENS, TraceRequest
from gateway.tools.sim.cache import PrefixCache

QUANTILES = (10, 25, 50, 75, 90, 99)


@dataclass(frozen=True, slots=True)
class Distribution:
    """A few order statistics of a sample."""

    count: int
    mean: float
    minimum: float
    maximum: float
    quantiles: tuple[tuple[int, float], ...]  # (percent, value)

    def at(self, percent: int) -> float:
        """The value at one of `QUANTILES`."""
        return dict(self.quantiles)[percent]


@dataclass(frozen=True, slots=True)
class Ceiling:
    """Prompt tokens and the share of them a cache could have served."""

    prompt_tokens: int
    cached_tokens: int

    @property
    def rate(self) -> float:
        """The share of prompt tokens a cache could have served; 0.0 without prompt tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class TraceAnalysis:
    """Everything about a trace that does not depend on the routing policy."""

    requests: int
    ceiling: Ceiling
    pooled: Ceiling
    pooled_capacity_blocks: int
    prompt_lengths: Distribution
    repeat_intervals: Distribution
    # With lower tiers: one cache of all tiers' blocks (else None).
    pooled_tiers: Ceiling | None = None
    pooled_tiers_capacity_blocks: int = 0


def analyze(
    requests: Sequence[TraceRequest],
    *,
    replicas: int,
    capacity_blocks: int,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    lower_blocks: int = 0,
) -> TraceAnalysis:
    """Ceilings and distributions of a trace for a fleet of ``replicas x capacity_blocks``
    (and ``lower_blocks`` more per replica in lower tiers)."""
    pooled_blocks = replicas * capacity_blocks
    tiered_blocks = replicas * (capacity_blocks + lower_blocks)
    tiered = (
        pooled_ceiling(requests, capacity_blocks=tiered_blocks, block_tokens=block_tokens)
        if lower_blocks
        else None
    )
    return TraceAnalysis(
        requests=len(requests),
        ceiling=infinite_ceiling(requests, block_tokens=block_tokens),
        pooled=pooled_ceiling(requests, capacity_blocks=pooled_blocks, block_tokens=block_tokens),
        pooled_capacity_blocks=pooled_blocks,
        prompt_lengths=prompt_lengths(requests),
        repeat_intervals=repeat_intervals(requests),
        pooled_tiers=tiered,
        pooled_tiers_capacity_blocks=tiered_blocks if lower_blocks else 0,
    )


def describe(values: Sequence[float]) -> Distribution:
    """Count, mean, extremes and `QUANTILES` of the values."""
    if not values:
        return Distribution(0, 0.0, 0.0, 0.0, tuple((q, 0.0) for q in QUANTILES))
    ordered = sorted(values)
    return Distribution(
        count=len(ordered),
        mean=sum(ordered) / len(ordered),
        minimum=ordered[0],
        maximum=ordered[-1],
        quantiles=tuple((q, percentile(ordered, q)) for q in QUANTILES),
    )


def infinite_ceiling(
    requests: Sequence[TraceRequest], *, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> Ceiling:
    """Tokens an infinite cache in one pool could have served, in arrival order."""
    seen = HitCeiling(max_entries=max(1, sum(len(r.hash_ids) for r in requests)))
    prompt = cached = 0
    for request in requests:
        blocks = seen.observe("trace", request.hash_ids)
        prompt += request.input_length
        cached += min(blocks * block_tokens, request.input_length)
    return Ceiling(prompt, cached)


def pooled_ceiling(
    requests: Sequence[TraceRequest],
    *,
    capacity_blocks: int,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> Ceiling:
    """Tokens one LRU cache of ``capacity_blocks`` full blocks could have served."""
    cache = PrefixCache(capacity_blocks)
    prompt = cached = 0
    for request in requests:
        admission = cache.admit(request.cacheable(block_tokens))
        cache.release(admission.pinned)
        cap = max(0, (request.input_length - 1) // block_tokens)
        prompt += request.input_length
        cached += min(admission.hit_blocks, cap) * block_tokens
    return Ceiling(prompt, cached)


def prompt_lengths(requests: Sequence[TraceRequest]) -> Distribution:
    """Prompt tokens per request."""
    return describe([r.input_length for r in requests])


def repeat_intervals(requests: Sequence[TraceRequest]) -> Distribution:
    """Seconds between consecutive uses of the same block, over every reuse."""
    return describe(repeat_gaps(requests))


def repeat_gaps(requests: Sequence[TraceRequest]) -> list[float]:
    """Every reuse's seconds since the block's previous use, in trace order."""
    last: dict[int, int] = {}
    gaps: list[float] = []
    for request in requests:
        now = request.timestamp_ms
        for block in request.hash_ids:
            before = last.get(block)
            if before is not None:
                gaps.append((now - before) / 1000.0)
            last[block] = now
    return gaps
