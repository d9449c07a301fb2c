"""Where a prompt's block chain first leaves its predecessor's: the prefix break.

Two prompts of one interaction (a conversation's turns, an agent's steps) usually share a
prefix: the later one resends the earlier one and appends to it. Something that changes
early in the prompt on every call (a timestamp at the top of the system prompt, a tool list
in another order, a document re-inserted with a fresh id) breaks the chain there, and every
block after the break is computed, and billed, again.

Block hashes are chained (each names its parent), so chains that agree at block ``i`` agree
on every block before it: the first difference is found by bisection, a handful of
comparisons even for a long prompt. A prompt that extends its predecessor, or repeats a
prefix of it, agrees on every block both have: no break.

Offsets are tokens. In token mode a block is ``block_tokens`` of the replica's own tokens;
in text mode (no tokenizer) a block is a chunk of characters standing for about that many,
and offsets are scaled to the prompt tokens the replica reported, as predictions are.

Pure: no clock, no I/O, ints only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A break inside the first tenth of the prompt, or in its first two blocks, is "early": the
# "put the stable text first" case.
EARLY_SHARE = 10
EARLY_BLOCKS = 2


def first_difference(previous: Sequence[int], current: Sequence[int]) -> int | None:
    """Index of the first block where the chains differ, among the blocks both have; None
    when one chain is a prefix of the other (an extension, a repeat, a shortening)."""
    common = min(len(previous), len(current))
    if common == 0 or previous[common - 1] == current[common - 1]:
        return None  # chained: the last common block equal means every earlier one is
    low, high = 0, common - 1  # previous[high] != current[high]; answer in [low, high]
    while low < high:
        middle = (low + high) // 2
        if previous[middle] == current[middle]:
            low = middle + 1
        else:
            high = middle
    return low


@dataclass(frozen=True, slots=True)
class PrefixBreak:
    """Where one request's prompt left its predecessor's, and what that cost in tokens.

    ``lost_tokens`` = min(predecessor's prompt tokens, this prompt's) - ``break_tokens``:
    the part of the predecessor's length this prompt could not reuse.
    """

    break_tokens: int
    lost_tokens: int
    early: bool
    # JSON of the text either side of the divergence (tenants that opted in), else None.
    context: str | None = None


def measure(
    previous: Sequence[int],
    current: Sequence[int],
    *,
    block_tokens: int,
    previous_tokens: int,
    current_tokens: int,
    scale: tuple[int, int] | None = None,
) -> PrefixBreak | None:
    """The break between two chains of the same block size, or None when there is none.

    ``previous_tokens`` and ``current_tokens`` are the two prompts' tokens as the replica
    counted them; ``scale`` = (reported, estimated) prompt tokens of the current prompt in
    text mode, where a block's offset is an estimate scaled to what was reported.
    """
    index = first_difference(previous, current)
    if index is None:
        return None
    offset = index * block_tokens
    if scale is not None:
        reported, estimated = scale
        offset = offset * reported // max(estimated, 1)
    lost = min(previous_tokens, current_tokens) - offset
    if lost <= 0:
        return None  # the difference lies past what both prompts hold: nothing was lost
    early = index < EARLY_BLOCKS or offset * EARLY_SHARE < current_tokens
    return PrefixBreak(break_tokens=offset, lost_tokens=lost, early=early)
