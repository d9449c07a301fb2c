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

A timing finding is confirmed before it is called: when the audit is significant, the stage
runs a second audit of the same size on new prompts, and timing evidence is the two
together. An endpoint that isolates its tenants is then called sharing at a rate of about
alpha squared (1 in 10,000 at the default), not alpha: a busy machine's one unlucky sample
(a pause that happened to land on the fresh prompts) no longer fails an honest endpoint.
A cache that is really shared shows up in both samples, as it shows in the control.

With ``timing_only`` the usage is withheld from the auditor: the verdict rests on timing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
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
class Sample:
    """One audit: the first key's control pairs and the second key's probes."""

    control_cold: tuple[Outcome, ...]
    control_warm: tuple[Outcome, ...]
    warmed: tuple[Outcome, ...]  # the second key, on prompts the first key warmed
    fresh: tuple[Outcome, ...]  # the second key, on prompts nobody sent before
    order: tuple[str, ...]  # "warmed" / "fresh", as sent


@dataclass(frozen=True, slots=True)
class Isolation(Sample):
    """The stage: the first audit's sample, and the confirmation's."""

    confirmation: Sample | None = None  # run only when the first audit was significant


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str
    failed: bool
    leaked_cached_tokens: int | None  # None when withheld (timing only)
    audit: RankTest | None
    confirmation: RankTest | None  # the second audit, when the first was significant
    control: RankTest | None
    timing_shared: bool
    control_detectable: bool


def planned(plan: Plan) -> int:
    """Requests the stage sends (twice that when a significant audit is confirmed)."""
    return 4 * plan.audit_samples


async def run(ctx: Context) -> Isolation:
    """Audit once; when timing says sharing, audit again on new prompts to confirm it."""
    rng = random.Random(ctx.config.seed)
    first = await _sample(ctx, rng)
    confirmation = None
    if _significant(_test(ttfts(first.warmed), ttfts(first.fresh)), ctx.config.audit):
        ctx.progress.revise(ctx.progress.total + planned(ctx.plan))
        confirmation = await _sample(ctx, rng)
    return Isolation(
        first.control_cold,
        first.control_warm,
        first.warmed,
        first.fresh,
        first.order,
        confirmation,
    )


async def _sample(ctx: Context, rng: random.Random) -> Sample:
    """Warm a batch with the first key, audit it with the second, until enough samples."""
    plan = ctx.plan
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
    return Sample(tuple(cold), tuple(warm), tuple(warmed), tuple(fresh), tuple(order))


def judge(result: Isolation, audit: Audit) -> Verdict:
    """The verdict from usage (unless withheld) and from timing, confirmed."""
    audit_test = _test(ttfts(result.warmed), ttfts(result.fresh))
    control_test = _test(ttfts(result.control_warm), ttfts(result.control_cold))
    again = result.confirmation
    confirm_test = None if again is None else _test(ttfts(again.warmed), ttfts(again.fresh))
    timing = _significant(audit_test, audit) and _significant(confirm_test, audit)
    detectable = _significant(control_test, audit)
    probes = result.warmed + (() if again is None else again.warmed)
    leaked = None if audit.timing_only else sum(o.cached_tokens for o in probes)
    failed = timing or bool(leaked)
    return Verdict(
        verdict=SHARED if failed else NOT_SHARED,
        failed=failed,
        leaked_cached_tokens=leaked,
        audit=audit_test,
        confirmation=confirm_test,
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
        "confirmation": _confirmation(result.confirmation, verdict, rows),
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


def _confirmation(
    sample: Sample | None, verdict: Verdict, rows: Callable[[tuple[Outcome, ...]], Any]
) -> dict[str, Any] | None:
    """The second audit's test, TTFTs and requests; None when the first was not significant."""
    if sample is None:
        return None
    return {
        "audit": rank_test_json(verdict.confirmation),
        "ttft_s": {
            "warmed": ttft_json(ttfts(sample.warmed)),
            "fresh": ttft_json(ttfts(sample.fresh)),
        },
        "order": list(sample.order),
        "requests": {"warmed": rows(sample.warmed), "fresh": rows(sample.fresh)},
    }


def _test(x: list[float], y: list[float]) -> RankTest | None:
    return mann_whitney_less(x, y) if x and y else None


def _significant(test: RankTest | None, audit: Audit) -> bool:
    return test is not None and test.significant(alpha=audit.alpha, min_effect=audit.min_effect)
