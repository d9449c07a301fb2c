"""Stage 2, partial matches: a base prompt is sent, then a probe sharing its first k% and
diverging after; the probe's cached tokens against the full blocks of the shared part.

The probe diverges half a block past a block boundary, so that the expected count, full
blocks of (template head + shared words), does not depend on the chat template's head as
long as the head is under half a block (a few tokens for common templates). At k = 100
the probe is the base itself and the cap on the last prompt token applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.tools.cachetest.client import Outcome
from gateway.tools.cachetest.context import Context
from gateway.tools.cachetest.figures import outcome_json
from gateway.tools.cachetest.plan import Plan
from gateway.tools.cachetest.stats import percentile


@dataclass(frozen=True, slots=True)
class Probe:
    """One step: the share asked for, the words actually shared, and the two requests."""

    percent: int
    shared_words: int
    base: Outcome
    probe: Outcome
    expected_cached: int


@dataclass(frozen=True, slots=True)
class Partial:
    words: int
    probes: tuple[Probe, ...]


def planned(plan: Plan) -> int:
    """Requests the stage sends."""
    return plan.partial_repeats * (1 + len(plan.partial_steps))


def shared_words(percent: int, words: int, block_size: int) -> int:
    """Words the probe shares with the base: k% of them, moved to mid-block (0 and all kept)."""
    if percent <= 0:
        return 0
    if percent >= 100:
        return words
    nominal = round(percent * words / 100)
    return min(nominal // block_size * block_size + block_size // 2, words - 1)


def expected_cached(shared: int, words: int, prompt_tokens: int, block_size: int) -> int:
    """Full blocks of the shared part (one token per word), capped below the last token."""
    cap = max(0, prompt_tokens - 1) // block_size
    blocks = cap if shared >= words else shared // block_size
    return min(blocks, cap) * block_size


async def run(ctx: Context) -> Partial:
    """For each repeat a fresh base, warmed once, then one probe per step in order."""
    plan, words, block = ctx.plan, ctx.plan.prompt_words, ctx.block_size
    probes = []
    for _ in range(plan.partial_repeats):
        number = ctx.fresh()
        base = await ctx.send(ctx.prompts.text(number, words))
        for percent in plan.partial_steps:
            shared = shared_words(percent, words, block)
            probe = await ctx.send(ctx.prompts.diverging(number, words, shared))
            expected = expected_cached(shared, words, probe.prompt_tokens, block)
            probes.append(Probe(percent, shared, base, probe, expected))
    return Partial(words, tuple(probes))


def figures(result: Partial) -> dict[str, Any]:
    """Per step: cached tokens (mean over repeats) against expected, and TTFT."""
    steps = []
    for percent in sorted({p.percent for p in result.probes}):
        chosen = [p for p in result.probes if p.percent == percent and p.probe.ok]
        ttft = [p.probe.ttft_s for p in chosen if p.probe.ttft_s is not None]
        steps.append(
            {
                "percent": percent,
                "shared_words": chosen[0].shared_words if chosen else None,
                "probes": len(chosen),
                "cached_tokens": [p.probe.cached_tokens for p in chosen],
                "expected_cached_tokens": [p.expected_cached for p in chosen],
                "prompt_tokens": [p.probe.prompt_tokens for p in chosen],
                "matches": all(p.probe.cached_tokens == p.expected_cached for p in chosen),
                "ttft_p50_s": percentile(ttft, 50) if ttft else None,
            }
        )
    return {
        "words": result.words,
        "steps": steps,
        "all_match": all(s["matches"] for s in steps),
        "requests": [
            {"percent": p.percent, "role": role, **outcome_json(o)}
            for p in result.probes
            for role, o in (("base", p.base), ("probe", p.probe))
        ],
    }
