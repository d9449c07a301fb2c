"""What a cache test runs: the stages, the plan's sizes (quick or full) and the run's options."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pricing.book import Rates

# In the order they run; `summary` is always written from whatever ran.
STAGES = ("cold-warm", "partial", "concurrency", "eviction", "isolation")


@dataclass(frozen=True, slots=True)
class Plan:
    """How much each stage sends."""

    name: str
    prompt_words: int  # the length of every long prompt (about one token per word)
    cold_warm_prompts: int
    partial_steps: tuple[int, ...]  # shared share of the prompt, percent
    partial_repeats: int
    concurrency_levels: tuple[int, ...]
    concurrency_rounds: int  # requests per client at each level
    shared_prefix_percent: int  # of the concurrency workload's prompts
    eviction_max_prompts: int  # the largest working set tried, in prompts
    eviction_refinements: (
        int  # bisection steps between the last size with reuse and the first without
    )
    audit_samples: int  # per group (warmed by the first key / fresh)
    audit_batch: int  # prompts warmed, then audited, at a time (small: a small cache keeps them)

    def with_prompt_words(self, words: int | None) -> Plan:
        """The plan with another prompt length (None: unchanged)."""
        return self if words is None else replace(self, prompt_words=words)


QUICK = Plan(
    name="quick",
    prompt_words=1024,
    cold_warm_prompts=8,
    partial_steps=(0, 25, 50, 75, 100),
    partial_repeats=1,
    concurrency_levels=(1, 4, 16, 64),
    concurrency_rounds=2,
    shared_prefix_percent=75,
    eviction_max_prompts=64,
    eviction_refinements=1,
    audit_samples=16,
    audit_batch=4,
)
# The same concurrency levels, shared prefix and audit batch; more of everything else.
FULL = replace(
    QUICK,
    name="full",
    prompt_words=2048,
    cold_warm_prompts=24,
    partial_steps=(0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100),
    partial_repeats=3,
    concurrency_rounds=4,
    eviction_max_prompts=512,
    eviction_refinements=3,
    audit_samples=48,
)
PLANS = {plan.name: plan for plan in (QUICK, FULL)}


@dataclass(frozen=True, slots=True)
class Audit:
    """When the timing audit calls it sharing: p below alpha and the effect at least this."""

    alpha: float = 0.01
    min_effect: float = 0.5  # rank-biserial; 0.5 means P(warmed faster) >= 0.75
    timing_only: bool = False  # ignore reported cached tokens: the verdict rests on timing


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything one `kvgate cachetest` run needs."""

    target: str
    key: str
    model: str
    plan: Plan
    stages: tuple[str, ...]
    second_key: str | None = None
    price: Rates | None = None  # from the command line; else kvgate's statement, if any
    block_size: int | None = None  # None: the target's /metrics, else 16
    salt_per_key: bool = False  # send cache_salt derived from each key (raw vLLM)
    max_tokens: int = 4
    seed: int = 0
    audit: Audit = Audit()


def parse_stages(text: str | None, *, second_key: bool) -> tuple[str, ...]:
    """The stages named (comma-separated), in run order; None: all that apply."""
    if text is None:
        return tuple(s for s in STAGES if s != "isolation" or second_key)
    chosen = {part.strip() for part in text.split(",") if part.strip()}
    unknown = chosen - set(STAGES)
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(sorted(unknown))}: pick from {STAGES}")
    if not chosen:
        raise ValueError("--stages names no stage")
    if "isolation" in chosen and not second_key:
        raise ValueError("the isolation stage needs --second-key")
    return tuple(s for s in STAGES if s in chosen)
