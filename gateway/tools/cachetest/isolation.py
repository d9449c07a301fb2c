"""Stage 5, tenant isolation: does the second key get anything from what the first one cached?

In batches (so that a small cache still holds them), the first key sends prompts twice,
cold then warm: they are now cached for it, and the pair is the control, showing that the
endpoint's cache is visible in TTFT at all. The second key then sends those exact prompts
and as many fresh prompts of the same length, interleaved in a random order.

Two kinds of evidence:

- usage: the second key's cached tokens on the first key's prompts must be 0;
- timing: a one-sided Mann-Whitney test that the second key's TTFT on the warmed prompts is
  below its TTFT on fresh ones. Sharing is called only when p < alpha AND the rank-biserial
  effect reaches a minimum, so a significant but tiny shift (noise, a warm connection) is
  not called sharing.

With ``timing_only`` the usage is withheld from the auditor: the verdict rests on timing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from gateway.tools.cachetest.client import Outcome
from gateway.tools.cachetest.context import Context
from gateway.tools.cachetest.figures import outcome_json, rank_test_json, ttft_json, ttfts
from gateway.tools.cachetest.plan import Audit, Plan
from gateway.tools.cachetest.stats import RankTest, mann_whitney_less

SHARED = "cache shared across keys"
NOT_SHARED = "no evidence of sharing"


@dataclass(frozen=True, slots=True)
class Isolation:
    control_cold: tuple[Outcome, ...]
    control_warm: tuple[Outcome, ...]
    warmed: tuple[Outcome, ...]  # the second key, on prompts the first key warmed
    fresh: tuple[Outcome, ...]  # the second key, on prompts nobody sent before
    order: tuple[str, ...]  # "warmed" / "fresh", as sent


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str
    failed: bool
    leaked_cached_tokens: int | None  # None when withheld (timing only)
    audit: RankTest | None
    control: RankTest | None
    timing_shared: bool
    control_detectable: bool


def planned(plan: Plan) -> int:
    """Requests the stage sends."""
    return 4 * plan.audit_samples


async def run(ctx: Context) -> Isolation:
    """Warm a batch with the first key, audit it with the second, until enough samples."""
    plan = ctx.plan
    rng = random.Random(ctx.config.seed)
    cold: list[Outcome] = []
    warm: list[Outcome] = []
    warmed: list[Outcome] = []
    fresh: list[Outcome] = []
    order: list[str] = []
    remaining = plan.audit_samples
    while remaining > 0:
        batch = min(plan.audit_batch, remaining)
        remaining -= batch
        texts = [ctx.text() for _ in range(batch)]
        for text in texts:
            cold.append(await ctx.send(text))
            warm.append(await ctx.send(text))
        queue = [("warmed", text) for text in texts] + [("fresh", ctx.text()) for _ in texts]
        rng.shuffle(queue)
        for group, text in queue:
            outcome = await ctx.send(text, second=True)
            (warmed if group == "warmed" else fresh).append(outcome)
            order.append(group)
    return Isolation(tuple(cold), tuple(warm), tuple(warmed), tuple(fresh), tuple(order))


def judge(result: Isolation, audit: Audit) -> Verdict:
    """The verdict from usage (unless withheld) and from timing."""
    audit_test = _test(ttfts(result.warmed), ttfts(result.fresh))
    control_test = _test(ttfts(result.control_warm), ttfts(result.control_cold))
    timing = audit_test is not None and audit_test.significant(
        alpha=audit.alpha, min_effect=audit.min_effect
    )
    detectable = control_test is not None and control_test.significant(
        alpha=audit.alpha, min_effect=audit.min_effect
    )
    leaked = None if audit.timing_only else sum(o.cached_tokens for o in result.warmed)
    failed = timing or bool(leaked)
    return Verdict(
        verdict=SHARED if failed else NOT_SHARED,
        failed=failed,
        leaked_cached_tokens=leaked,
        audit=audit_test,
        control=control_test,
        timing_shared=timing,
        control_detectable=detectable,
    )


def figures(result: Isolation, verdict: Verdict, audit: Audit) -> dict[str, Any]:
    """The audit's numbers and verdict; per-request cached tokens withheld when timing only."""

    def rows(outcomes: tuple[Outcome, ...]) -> list[dict[str, Any]]:
        out = [outcome_json(o) for o in outcomes]
        if audit.timing_only:
            for row in out:
                row.pop("cached_tokens")
        return out

    return {
        "verdict": verdict.verdict,
        "failed": verdict.failed,
        "evidence": {
            "usage": None if audit.timing_only else bool(verdict.leaked_cached_tokens),
            "timing": verdict.timing_shared,
        },
        "timing_only": audit.timing_only,
        "alpha": audit.alpha,
        "min_effect": audit.min_effect,
        "leaked_cached_tokens": verdict.leaked_cached_tokens,
        "audit": rank_test_json(verdict.audit),
        "control": rank_test_json(verdict.control),
        "control_detectable": verdict.control_detectable,
        "ttft_s": {
            "warmed": ttft_json(ttfts(result.warmed)),
            "fresh": ttft_json(ttfts(result.fresh)),
            "control_cold": ttft_json(ttfts(result.control_cold)),
            "control_warm": ttft_json(ttfts(result.control_warm)),
        },
        "order": list(result.order),
        "requests": {
            "warmed": rows(result.warmed),
            "fresh": rows(result.fresh),
            "control_cold": [outcome_json(o) for o in result.control_cold],
            "control_warm": [outcome_json(o) for o in result.control_warm],
        },
    }


def _test(x: list[float], y: list[float]) -> RankTest | None:
    return mann_whitney_less(x, y) if x and y else None
