"""The first difference of two block chains, and the break it makes (gateway.routing.breaks)."""

from __future__ import annotations

import pytest

from gateway.routing.breaks import PrefixBreak, first_difference, measure


def chain(*blocks: int) -> list[int]:
    """A chained list: each value stands for a hash of all the blocks up to it."""
    out, parent = [], 0
    for block in blocks:
        parent = hash((parent, block))
        out.append(parent)
    return out


@pytest.mark.parametrize(
    ("previous", "current", "expected"),
    [
        ((1, 2, 3), (1, 2, 3, 4, 5), None),  # an extension
        ((1, 2, 3, 4), (1, 2), None),  # a shortening (a prefix of it)
        ((1, 2, 3), (1, 2, 3), None),  # a repeat
        ((), (1, 2), None),
        ((1, 2, 3), (9, 2, 3), 0),
        ((1, 2, 3, 4, 5), (1, 2, 3, 9, 5, 6), 3),
        ((1, 2, 3, 4, 5), (1, 2, 3, 4, 9), 4),
    ],
)
def test_the_first_differing_block_is_found_among_the_blocks_both_have(
    previous: tuple[int, ...], current: tuple[int, ...], expected: int | None
) -> None:
    assert first_difference(chain(*previous), chain(*current)) == expected


def test_bisection_finds_every_position_of_a_long_chain() -> None:
    base = list(range(600))
    for at in (0, 1, 2, 255, 256, 511, 599):
        changed = [*base[:at], -1, *base[at + 1 :]]
        assert first_difference(chain(*base), chain(*changed)) == at


def test_lost_tokens_are_the_shorter_prompt_less_the_break_offset() -> None:
    found = measure(
        chain(1, 2, 3, 4, 5, 6),
        chain(1, 2, 9, 4, 5, 6, 7),
        block_tokens=16,
        previous_tokens=100,
        current_tokens=120,
    )
    # Block 2 starts at token 32; min(100, 120) - 32 = 68 tokens not reused.
    assert found == PrefixBreak(break_tokens=32, lost_tokens=68, early=False)


def test_a_break_in_the_first_two_blocks_or_the_first_tenth_is_early() -> None:
    blocks = list(range(100))
    # Block 1 of a 100-token prompt: past its first tenth, inside its first two blocks.
    at_block_1 = [0, -1, *blocks[2:7]]
    assert measure(
        chain(*blocks), chain(*at_block_1), block_tokens=16, previous_tokens=1600,
        current_tokens=100,
    ) == PrefixBreak(16, 84, True)  # fmt: skip
    # Block 9 starts at token 144 < 10 % of 1,600: early though past two blocks.
    at_block_9 = [*blocks[:9], -1, *blocks[10:]]
    found = measure(
        chain(*blocks), chain(*at_block_9), block_tokens=16, previous_tokens=1600,
        current_tokens=1600,
    )  # fmt: skip
    assert found is not None and found.break_tokens == 144 and found.early
    at_block_10 = [*blocks[:10], -1, *blocks[11:]]
    found = measure(
        chain(*blocks), chain(*at_block_10), block_tokens=16, previous_tokens=1600,
        current_tokens=1600,
    )  # fmt: skip
    assert found is not None and found.break_tokens == 160 and not found.early


def test_text_mode_offsets_are_scaled_to_the_reported_prompt() -> None:
    # Text chunks stand for 16 tokens each of an estimated 400; the replica counted 500.
    found = measure(
        chain(1, 2, 3, 4, 5),
        chain(1, 2, 3, 9, 5),
        block_tokens=16,
        previous_tokens=480,
        current_tokens=500,
        scale=(500, 400),
    )
    assert found == PrefixBreak(break_tokens=3 * 16 * 500 // 400, lost_tokens=480 - 60, early=False)


def test_no_break_when_nothing_of_the_predecessor_was_left_to_reuse() -> None:
    assert (
        measure(chain(1, 2, 3), chain(1, 9), block_tokens=16, previous_tokens=16, current_tokens=20)
        is None
    )
