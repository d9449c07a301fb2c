"""Stage 4, eviction: fill the cache with a working set of distinct prompts, then revisit
them in the same order; grow the set until the revisits stop hitting.

Sizes double from one prompt up to the plan's limit, then bisect between the last size
that still reused and the first that did not. Under LRU a working set past the cache's
size hits nothing on an in-order revisit (each revisit evicts the next one needed), so
reuse falls off a cliff at about the cache's size. Reuse has disappeared at a size whose
revisit hit rate is under a tenth of the smallest working set's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.tools.cachetest.client import Outcome
from gateway.tools.cachetest.context import Context
from gateway.tools.cachetest.costs import spend
from gateway.tools.cachetest.plan import Plan

GONE_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class WorkingSet:
    prompts: int
    fill: tuple[Outcome, ...]
    revisit: tuple[Outcome, ...]

    @property
    def tokens(self) -> int:
        """Prompt tokens of the working set."""
        return sum(o.prompt_tokens for o in self.fill)

    @property
    def hit_rate(self) -> float:
        """Token hit rate of the revisits."""
        return spend(self.revisit, None).token_hit_rate


@dataclass(frozen=True, slots=True)
class Eviction:
    sizes: tuple[WorkingSet, ...]  # by number of prompts

    @property
    def baseline(self) -> float:
        """The hit rate at the smallest working set; 0.0 with none."""
        return self.sizes[0].hit_rate if self.sizes else 0.0

    def gone(self, size: WorkingSet) -> bool:
        """Whether reuse has disappeared at this size."""
        return size.hit_rate < GONE_SHARE * self.baseline or self.baseline == 0

    @property
    def first_gone(self) -> WorkingSet | None:
        """The smallest working set whose revisits no longer hit."""
        return next((s for s in self.sizes if self.gone(s)), None)

    @property
    def last_reuse(self) -> WorkingSet | None:
        """The largest working set below the first gone one that still hit."""
        gone = self.first_gone
        limit = gone.prompts if gone is not None else None
        kept = [s for s in self.sizes if not self.gone(s) and (limit is None or s.prompts < limit)]
        return kept[-1] if kept else None


def doubling(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit`` (``limit`` itself last if not a power of two)."""
    sizes = []
    size = 1
    while size < limit:
        sizes.append(size)
        size *= 2
    sizes.append(limit)
    return sizes


def planned(plan: Plan) -> int:
    """Requests the stage sends at most."""
    most = sum(doubling(plan.eviction_max_prompts))
    return 2 * (most + plan.eviction_refinements * plan.eviction_max_prompts)


async def run(ctx: Context) -> Eviction:
    """Grow, then bisect, until reuse is bracketed or the plan's limit is reached."""
    plan = ctx.plan
    sizes: list[WorkingSet] = []
    result = Eviction(())
    for prompts in doubling(plan.eviction_max_prompts):
        sizes.append(await _working_set(ctx, prompts))
        result = Eviction(tuple(sizes))
        if result.first_gone is not None:
            break
    for _ in range(plan.eviction_refinements):
        low, high = result.last_reuse, result.first_gone
        if low is None or high is None or high.prompts - low.prompts < 2:
            break
        sizes.append(await _working_set(ctx, (low.prompts + high.prompts) // 2))
        result = Eviction(tuple(sorted(sizes, key=lambda s: s.prompts)))
    ctx.progress.revise(ctx.progress.total - (planned(plan) - 2 * sum(s.prompts for s in sizes)))
    return result


async def _working_set(ctx: Context, prompts: int) -> WorkingSet:
    numbers = [ctx.fresh() for _ in range(prompts)]
    fill = [await ctx.send(ctx.text(n)) for n in numbers]
    revisit = [await ctx.send(ctx.text(n)) for n in numbers]
    return WorkingSet(prompts, tuple(fill), tuple(revisit))


def figures(result: Eviction, block_size: int) -> dict[str, Any]:
    """Hit rate by working-set size, and where reuse disappears."""
    gone, last = result.first_gone, result.last_reuse
    return {
        "gone_share": GONE_SHARE,
        "sizes": [
            {
                "prompts": s.prompts,
                "tokens": s.tokens,
                "blocks": s.tokens // block_size,
                "hit_rate": s.hit_rate,
                "gone": result.gone(s),
                "errors": sum(not o.ok for o in (*s.fill, *s.revisit)),
            }
            for s in result.sizes
        ],
        "last_reuse_tokens": None if last is None else last.tokens,
        "reuse_gone_tokens": None if gone is None else gone.tokens,
        "reuse_gone_prompts": None if gone is None else gone.prompts,
    }
