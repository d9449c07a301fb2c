"""How the isolation audit and the eviction sweep read their requests (no network)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.tools.cachetest import isolation as stage
from gateway.tools.cachetest.client import Outcome
from gateway.tools.cachetest.eviction import Eviction, WorkingSet, doubling
from gateway.tools.cachetest.isolation import NOT_SHARED, SHARED, Isolation, Sample, judge
from gateway.tools.cachetest.plan import QUICK, Audit
from gateway.tools.cachetest.progress import Progress


def ok(ttft_s: float, cached: int = 0, prompt: int = 1000) -> Outcome:
    return Outcome(200, prompt, cached, 4, ttft_s, ttft_s + 0.01)


def isolation(
    warmed: list[float],
    fresh: list[float],
    *,
    leaked: int = 0,
    again: tuple[list[float], list[float]] | None = None,
) -> Isolation:
    cold = tuple(ok(0.030 + i / 1000) for i in range(16))
    warm = tuple(ok(0.005 + i / 1000, cached=992) for i in range(16))
    confirmation = None
    if again is not None:
        confirmation = Sample(
            cold, warm, tuple(ok(t) for t in again[0]), tuple(ok(t) for t in again[1]), ()
        )
    return Isolation(
        control_cold=cold,
        control_warm=warm,
        warmed=tuple(ok(t, cached=leaked) for t in warmed),
        fresh=tuple(ok(t) for t in fresh),
        order=(),
        confirmation=confirmation,
    )


SLOW = [0.030 + i / 1000 for i in range(16)]
FAST = [0.005 + i / 1000 for i in range(16)]


def test_warmed_prompts_as_slow_as_fresh_ones_are_no_evidence() -> None:
    verdict = judge(isolation(SLOW[::-1], SLOW), Audit())
    assert verdict.verdict == NOT_SHARED and not verdict.failed
    assert verdict.leaked_cached_tokens == 0
    assert verdict.control_detectable


def test_warmed_prompts_answered_fast_are_sharing_by_timing_alone() -> None:
    verdict = judge(isolation(FAST, SLOW, again=(FAST, SLOW)), Audit(timing_only=True))
    assert verdict.verdict == SHARED and verdict.failed and verdict.timing_shared
    assert verdict.leaked_cached_tokens is None
    assert verdict.audit is not None and verdict.audit.rank_biserial == 1.0
    assert verdict.confirmation is not None and verdict.confirmation.rank_biserial == 1.0


def test_one_significant_audit_the_confirmation_does_not_repeat_is_no_evidence() -> None:
    """A pause that landed on the fresh prompts of one audit: the second one is even."""
    verdict = judge(isolation(FAST, SLOW, again=(SLOW[::-1], SLOW)), Audit(timing_only=True))
    assert verdict.audit is not None and verdict.audit.p_value < 0.01
    assert verdict.confirmation is not None and verdict.confirmation.rank_biserial == 0.0
    assert (verdict.verdict, verdict.failed, verdict.timing_shared) == (NOT_SHARED, False, False)
    # Without a confirmation at all, timing alone is never called sharing.
    assert judge(isolation(FAST, SLOW), Audit(timing_only=True)).verdict == NOT_SHARED


def test_cached_tokens_in_the_confirmation_count_as_a_leak() -> None:
    result = isolation(FAST, SLOW, again=(FAST, SLOW))
    assert result.confirmation is not None
    leaky = replace(result.confirmation, warmed=tuple(ok(t, cached=32) for t in FAST))
    verdict = judge(replace(result, confirmation=leaky), Audit())
    assert (verdict.verdict, verdict.leaked_cached_tokens) == (SHARED, 16 * 32)


@dataclass
class ScriptedTarget:
    """A stand-in for the stage's context: the second key's TTFT on a prompt the first key
    sent is ``warmed_s``, on any other prompt ``fresh_s`` (each a cycle of values)."""

    warmed_s: list[float]
    fresh_s: list[float]
    plan: Any = QUICK
    config: Any = field(default_factory=lambda: _Config())
    progress: Progress = field(default_factory=lambda: Progress(4 * QUICK.audit_samples))
    _texts: itertools.count[int] = field(default_factory=itertools.count)
    _first: set[str] = field(default_factory=set)
    sent: list[tuple[str, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._warmed = itertools.cycle(self.warmed_s)
        self._fresh = itertools.cycle(self.fresh_s)

    def text(self) -> str:
        return f"prompt {next(self._texts)}"

    async def send(self, text: str, *, second: bool = False) -> Outcome:
        self.sent.append((text, second))
        self.progress.advance()
        if not second:
            self._first.add(text)
            return ok(0.03)
        return ok(next(self._warmed) if text in self._first else next(self._fresh))


@dataclass
class _Config:
    seed: int = 7
    audit: Audit = field(default_factory=Audit)


def test_the_stage_confirms_only_a_significant_audit_on_new_prompts() -> None:
    even = ScriptedTarget(SLOW, SLOW[::-1])
    result = asyncio.run(stage.run(even))  # type: ignore[arg-type]
    assert result.confirmation is None
    assert len(even.sent) == even.progress.total == 4 * QUICK.audit_samples

    shared = ScriptedTarget(FAST, SLOW)
    result = asyncio.run(stage.run(shared))  # type: ignore[arg-type]
    assert result.confirmation is not None
    assert len(shared.sent) == shared.progress.total == 8 * QUICK.audit_samples
    first = {t for t, _ in shared.sent[: 4 * QUICK.audit_samples]}
    again = {t for t, _ in shared.sent[4 * QUICK.audit_samples :]}
    assert not first & again  # the confirmation's prompts are all new
    verdict = judge(result, Audit(timing_only=True))
    assert verdict.verdict == SHARED and verdict.timing_shared


def test_reported_cached_tokens_fail_isolation_unless_withheld() -> None:
    leaking = isolation(SLOW[::-1], SLOW, leaked=16)
    verdict = judge(leaking, Audit())
    assert (verdict.verdict, verdict.leaked_cached_tokens, verdict.timing_shared) == (
        SHARED,
        256,
        False,
    )
    assert judge(leaking, Audit(timing_only=True)).verdict == NOT_SHARED


def test_a_shift_too_small_for_the_minimum_effect_is_not_sharing() -> None:
    """A 2 ms shift over 16 values 1 ms apart: U_x = (1 + ... + 13) + 14/2 = 98 of 256 pairs,
    so CLES = 0.617 and the rank-biserial effect 0.234, under the audit's 0.5."""
    warmed = [(t * 1000 - 2) / 1000 for t in SLOW]
    verdict = judge(isolation(warmed, SLOW), Audit())
    assert verdict.audit is not None
    assert verdict.audit.u_x == 98.0
    assert verdict.audit.rank_biserial == 0.234375
    assert verdict.verdict == NOT_SHARED


def working_set(prompts: int, hit_rate: float) -> WorkingSet:
    fill = tuple(ok(0.03) for _ in range(prompts))
    revisit = tuple(ok(0.01, cached=int(1000 * hit_rate)) for _ in range(prompts))
    return WorkingSet(prompts, fill, revisit)


def test_reuse_is_gone_under_a_tenth_of_the_smallest_working_sets_hit_rate() -> None:
    sweep = Eviction(
        (
            working_set(1, 0.99),
            working_set(2, 0.99),
            working_set(4, 0.5),
            working_set(8, 0.09),
            working_set(16, 0.0),
        )
    )
    assert sweep.first_gone is not None and sweep.first_gone.prompts == 8
    assert sweep.first_gone.tokens == 8000
    assert sweep.last_reuse is not None and sweep.last_reuse.prompts == 4


def test_no_reuse_at_all_is_gone_from_the_start() -> None:
    sweep = Eviction((working_set(1, 0.0),))
    assert sweep.first_gone is not None and sweep.last_reuse is None


def test_sizes_double_up_to_the_limit() -> None:
    assert doubling(64) == [1, 2, 4, 8, 16, 32, 64]
    assert doubling(24) == [1, 2, 4, 8, 16, 24]
    assert doubling(1) == [1]
