"""Stage 1, cold vs warm: distinct long prompts, each sent cold and then again at once.

A warm repeat can hit every full block but the one holding the last prompt token, which
vLLM always computes: ``(prompt_tokens - 1) // block_size`` blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.tools.cachetest.client import Outcome
from gateway.tools.cachetest.context import Context
from gateway.tools.cachetest.costs import Spend, spend
from gateway.tools.cachetest.figures import outcome_json, spend_json, ttft_json, ttfts
from gateway.tools.cachetest.plan import Plan
from pricing.book import Rates


@dataclass(frozen=True, slots=True)
class Pair:
    """One prompt, sent twice."""

    cold: Outcome
    warm: Outcome


@dataclass(frozen=True, slots=True)
class ColdWarm:
    pairs: tuple[Pair, ...]

    @property
    def cold(self) -> list[Outcome]:
        """Each pair's cold outcome, in order."""
        return [p.cold for p in self.pairs]

    @property
    def warm(self) -> list[Outcome]:
        """Each pair's warm outcome, in order."""
        return [p.warm for p in self.pairs]

    def spends(self, price: Rates | None) -> tuple[Spend, Spend]:
        """(cold pass, warm pass)."""
        return spend(self.cold, price), spend(self.warm, price)


def planned(plan: Plan) -> int:
    """Requests the stage sends."""
    return 2 * plan.cold_warm_prompts


async def run(ctx: Context) -> ColdWarm:
    """Each prompt cold, then warm, one prompt after another."""
    pairs = []
    for _ in range(ctx.plan.cold_warm_prompts):
        text = ctx.text()
        cold = await ctx.send(text)
        warm = await ctx.send(text)
        pairs.append(Pair(cold, warm))
    return ColdWarm(tuple(pairs))


def figures(result: ColdWarm, price: Rates | None, block_size: int) -> dict[str, Any]:
    """The stage's numbers, JSON-ready."""
    cold, warm = result.spends(price)
    expected = sum(
        (p.warm.prompt_tokens - 1) // block_size * block_size for p in result.pairs if p.warm.ok
    )
    return {
        "prompts": len(result.pairs),
        "cold": {**spend_json(cold), "ttft_s": ttft_json(ttfts(result.cold))},
        "warm": {**spend_json(warm), "ttft_s": ttft_json(ttfts(result.warm))},
        "warm_expected_cached_tokens": expected,
        "requests": [
            {"prompt": n, "pass": name, **outcome_json(o, price)}
            for n, pair in enumerate(result.pairs)
            for name, o in (("cold", pair.cold), ("warm", pair.warm))
        ],
    }
