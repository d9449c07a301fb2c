"""Deadlines that pass together are cut a few at a turn of the loop, not all in one.

A client that opens thousands of connections at once has their deadlines pass at once;
cutting them all in one turn of the event loop stalled every request in flight by the
whole wave (up to 93-194 ms for 2,000 in benchmarks/slow_clients.py). The reaper cuts
CUTS_PER_TURN of them (or a REAP_SHARE-th of those waiting, if more), then lets the loop
serve everything else for REAP_PAUSE_S.
"""

from __future__ import annotations

import asyncio
from itertools import groupby, pairwise
from typing import cast

import pytest

from gateway.server.connections import (
    CUTS_PER_TURN,
    REAP_PAUSE_S,
    REAP_SHARE,
    GuardedProtocol,
    Reaper,
)

Cut = tuple[int, float]  # (the request's steps so far, the loop's time)


class Connection:
    """Stands in for a GuardedProtocol past its deadline: notes when it is cut, and how
    many steps the request beside it had taken by then."""

    def __init__(self, loop: asyncio.AbstractEventLoop, steps: list[int], cut: list[Cut]) -> None:
        self.loop, self.steps, self.cut = loop, steps, cut

    def _reap(self) -> None:
        self.cut.append((len(self.steps), self.loop.time()))


def reap_all(waiting: int) -> list[list[Cut]]:
    """Queue ``waiting`` connections at once, with a request going on the loop beside them
    one step a turn; the cuts in the groups made between two steps of the request."""

    async def main() -> list[Cut]:
        loop = asyncio.get_running_loop()
        reaper, steps, cut = Reaper(), list[int](), list[Cut]()
        for _ in range(waiting):
            reaper.add(loop, cast(GuardedProtocol, Connection(loop, steps, cut)))
        while len(cut) < waiting:
            steps.append(len(cut))
            await asyncio.sleep(0)
        return cut

    return [list(group) for _, group in groupby(asyncio.run(main()), key=lambda c: c[0])]


def expected_turns(waiting: int) -> list[int]:
    """What each turn cuts: CUTS_PER_TURN, or a REAP_SHARE-th of those waiting if more."""
    turns = []
    while waiting:
        turns.append(min(waiting, max(CUTS_PER_TURN, waiting // REAP_SHARE)))
        waiting -= turns[-1]
    return turns


@pytest.mark.parametrize("waiting", [1, 50, 2_000])
def test_deadlines_that_pass_together_are_cut_a_few_at_a_turn_the_loop_free_between(
    waiting: int,
) -> None:
    turns = reap_all(waiting)
    # Between two turns the request beside them ran (each group is of one step of it).
    assert [len(turn) for turn in turns] == expected_turns(waiting)
    starts = [turn[0][1] for turn in turns]
    # Turns are REAP_PAUSE_S apart (less a millisecond: the loop's timer resolution).
    assert all(b - a >= REAP_PAUSE_S - 0.001 for a, b in pairwise(starts))
