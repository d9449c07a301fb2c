"""Replicas as bits: the bookkeeping every block index shares.

Each replica an index knows gets one bit; each block hash maps to the bit mask of the
replicas holding it, so `Holders.match_all` walks a prompt's chain once, however many
replicas there are, and stops as soon as no replica holds the next block. What a replica
holds (``_held``, keyed by block hash) is the index's own: copies per tier (exact), an
expiry (predicted), an LRU (approximate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

H = TypeVar("H", bound=Mapping[int, Any])


class Holders(Generic[H]):
    """Per replica a bit and its holdings; per block hash the mask of its holders."""

    # Whether `match_all`, once a single replica is left, walks that replica's holdings
    # directly (a long conversation's): half the work per block of the mask walk.
    _walk_alone = True

    def __init__(self) -> None:
        self._held: dict[str, H] = {}
        self._bits: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._holders: dict[int, int] = {}

    def match(self, replica: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica holds."""
        held = self._held.get(replica)
        if held is None:
            return 0
        hits = 0
        for block in hashes:
            if block not in held:
                break
            hits += 1
        return hits

    def match_all(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks held, per replica, in one walk of the chain."""
        found: dict[str, int] = {}
        holders = self._holders
        alive = holders.get(hashes[0], 0) if hashes else 0
        depth = 0
        count = len(hashes)
        while alive:
            if not alive & (alive - 1) and self._walk_alone:
                name = self._names[alive]
                found[name] = self._extend(name, hashes, depth + 1)
                break
            depth += 1
            still = holders.get(hashes[depth], 0) & alive if depth < count else 0
            gone = alive & ~still
            if gone:
                self._settle(found, gone, depth)
            alive = still
        return found

    def _extend(self, replica: str, hashes: Sequence[int], start: int) -> int:
        """Where the run of blocks in the replica's holdings from ``start`` ends."""
        held = self._held.get(replica)
        if not held:
            return start
        depth, count = start, len(hashes)
        while depth < count and hashes[depth] in held:
            depth += 1
        return depth

    def _add(self, replica: str, held: H) -> H:
        """Give a new replica the lowest free bit and these (empty) holdings."""
        bit = 1
        while bit in self._names:
            bit <<= 1
        self._bits[replica] = bit
        self._names[bit] = replica
        self._held[replica] = held
        return held

    def _drop(self, replica: str) -> tuple[H, int] | None:
        """Free a replica's bit and release every block it held: its holdings and bit,
        or None for a replica not known."""
        held = self._held.pop(replica, None)
        if held is None:
            return None
        bit = self._bits.pop(replica)
        del self._names[bit]
        for block in held:
            self._unhold(block, bit)
        return held, bit

    def _unhold(self, block: int, bit: int) -> None:
        rest = self._holders[block] & ~bit
        if rest:
            self._holders[block] = rest
        else:
            del self._holders[block]

    def _settle(self, found: dict[str, int], gone: int, depth: int) -> None:
        names = self._names
        while gone:
            low = gone & -gone
            found[names[low]] = depth
            gone ^= low
