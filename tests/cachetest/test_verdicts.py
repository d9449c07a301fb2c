"""How the isolation audit and the eviction sweep read their requests (no network)."""

from __future__ import annotations

from gateway.tools.cachetest.client import Outcome
from gateway.tools.cachetest.eviction import Eviction, WorkingSet, doubling
from gateway.tools.cachetest.isolation import NOT_SHARED, SHARED, Isolation, judge
from gateway.tools.cachetest.plan import Audit


def ok(ttft_s: float, cached: int = 0, prompt: int = 1000) -> Outcome:
    return Outcome(200, prompt, cached, 4, ttft_s, ttft_s + 0.01)


def isolation(warmed: list[float], fresh: list[float], *, leaked: int = 0) -> Isolation:
    cold = tuple(ok(0.030 + i / 1000) for i in range(16))
    warm = tuple(ok(0.005 + i / 1000, cached=992) for i in range(16))
    return Isolation(
        control_cold=cold,
        control_warm=warm,
        warmed=tuple(ok(t, cached=leaked) for t in warmed),
        fresh=tuple(ok(t) for t in fresh),
        order=(),
    )


SLOW = [0.030 + i / 1000 for i in range(16)]
FAST = [0.005 + i / 1000 for i in range(16)]


def test_warmed_prompts_as_slow_as_fresh_ones_are_no_evidence() -> None:
    verdict = judge(isolation(SLOW[::-1], SLOW), Audit())
    assert verdict.verdict == NOT_SHARED and not verdict.failed
    assert verdict.leaked_cached_tokens == 0
    assert verdict.control_detectable


def test_warmed_prompts_answered_fast_are_sharing_by_timing_alone() -> None:
    verdict = judge(isolation(FAST, SLOW), Audit(timing_only=True))
    assert verdict.verdict == SHARED and verdict.failed and verdict.timing_shared
    assert verdict.leaked_cached_tokens is None
    assert verdict.audit is not None and verdict.audit.rank_biserial == 1.0


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
