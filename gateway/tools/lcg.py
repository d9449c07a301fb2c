"""The tools' deterministic word draws: a 64-bit LCG (Knuth's MMIX constants) whose top six
bits pick one of 64 words, the same sequence from the same start on every machine.

The simulated replica's answers, the cache test plan's prompts and live replay's block
texts are all drawn this way, each from its own vocabulary and its own start.
"""

from __future__ import annotations

from collections.abc import Iterator

MASK64 = (1 << 64) - 1
# 2**64 / the golden ratio: spreads a small key (a seed, a number) over the state's bits.
GOLDEN = 0x9E3779B97F4A7C15
_MUL = 6364136223846793005
_ADD = 1442695040888963407


def draws(state: int) -> Iterator[int]:
    """Endless indices in [0, 64): the top six bits of each LCG step from ``state``."""
    while True:
        state = (state * _MUL + _ADD) & MASK64
        yield state >> 58
