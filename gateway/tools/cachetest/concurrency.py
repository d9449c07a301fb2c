"""Stage 3, concurrency: a shared-prefix workload at 1, 4, 16 and 64 concurrent clients.

At each level a fresh shared prefix (the plan's share of every prompt) is followed by a
suffix of the request's own; each client sends its requests one after another. The first
requests of a level find the prefix cold, later ones should hit it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from gateway.tools.cachetest.client import Outcome
from gateway.tools.cachetest.context import Context
from gateway.tools.cachetest.costs import spend
from gateway.tools.cachetest.figures import ttft_json, ttfts
from gateway.tools.cachetest.plan import Plan


@dataclass(frozen=True, slots=True)
class Level:
    clients: int
    outcomes: tuple[Outcome, ...]
    wall_s: float


@dataclass(frozen=True, slots=True)
class Concurrency:
    prefix_words: int
    suffix_words: int
    levels: tuple[Level, ...]


def planned(plan: Plan) -> int:
    """Requests the stage sends."""
    return sum(plan.concurrency_levels) * plan.concurrency_rounds


async def run(ctx: Context) -> Concurrency:
    """Every level in turn, its clients side by side."""
    plan = ctx.plan
    prefix_words = plan.prompt_words * plan.shared_prefix_percent // 100
    suffix_words = plan.prompt_words - prefix_words
    levels = []
    for clients in plan.concurrency_levels:
        prefix = ctx.fresh()

        async def client(prefix: int = prefix) -> list[Outcome]:
            out = []
            for _ in range(plan.concurrency_rounds):
                text = ctx.prompts.with_prefix(prefix, prefix_words, ctx.fresh(), suffix_words)
                out.append(await ctx.send(text))
            return out

        started = time.perf_counter()
        results = await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - started
        levels.append(Level(clients, tuple(o for r in results for o in r), wall))
    return Concurrency(prefix_words, suffix_words, tuple(levels))


def figures(result: Concurrency) -> dict[str, Any]:
    """Per level: hit rate, TTFT p50/p99, errors, throughput."""
    levels = []
    for level in result.levels:
        s = spend(level.outcomes, None)
        levels.append(
            {
                "clients": level.clients,
                "requests": s.requests,
                "errors": s.requests - s.completed,
                "token_hit_rate": s.token_hit_rate,
                "prompt_tokens": s.prompt_tokens,
                "cached_tokens": s.cached_tokens,
                "ttft_s": ttft_json(ttfts(level.outcomes)),
                "wall_s": level.wall_s,
                "requests_per_s": s.requests / level.wall_s if level.wall_s else None,
            }
        )
    return {
        "prefix_words": result.prefix_words,
        "suffix_words": result.suffix_words,
        "levels": levels,
    }
