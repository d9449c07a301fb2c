"""vLLM's automatic prefix cache as a model: chained block hashes, full blocks, LRU.

Used by the simulated replica (``kvgate sim``) and by the offline replay, so both see the
same cache. What it keeps from vLLM:

- a block is known by its chained hash; only full blocks are cached;
- a request hits the leading run of blocks that are held (the first miss ends the run);
- blocks in use by a running request are pinned (reference counted) and never evicted;
- freed blocks join an LRU free queue; a request's blocks are freed tail first, so within
  one request the tail is evicted before the head;
- eviction takes the least recently freed block, only when a new block needs the room.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Admission:
    """What admitting one request did to the cache."""

    hit_blocks: int
    pinned: list[Hashable] = field(default_factory=list)
    stored: list[Hashable] = field(default_factory=list)
    evicted: list[Hashable] = field(default_factory=list)


class PrefixCache:
    """A fixed number of KV blocks, named by chained hashes."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be at least 1")
        self.capacity_blocks = capacity_blocks
        self._refs: dict[Hashable, int] = {}
        self._free: OrderedDict[Hashable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._refs)

    def __contains__(self, block: Hashable) -> bool:
        return block in self._refs

    def blocks(self) -> list[Hashable]:
        """Every block held, pinned or free (what the replica's KV events have announced)."""
        return list(self._refs)

    @property
    def usage(self) -> float:
        """Share of blocks pinned by running requests (vLLM's kv_cache_usage_perc)."""
        return (len(self._refs) - len(self._free)) / self.capacity_blocks

    def match(self, blocks: Sequence[Hashable]) -> int:
        """How many leading blocks are held now, without touching recency."""
        hits = 0
        for block in blocks:
            if block not in self._refs:
                break
            hits += 1
        return hits

    def admit(self, blocks: Sequence[Hashable]) -> Admission:
        """Pin the blocks of a request about to run; store the new ones where room allows.

        A new block takes a never-used slot, else evicts the least recently freed block;
        when every block is pinned the rest of the request is computed but not cached.
        """
        admission = Admission(hit_blocks=self.match(blocks))
        for block in blocks:
            if block in self._refs:
                self._pin(block)
            elif self._make_room(admission.evicted):
                self._refs[block] = 1
                admission.stored.append(block)
            else:
                break
            admission.pinned.append(block)
        return admission

    def release(self, pinned: Sequence[Hashable]) -> None:
        """Unpin a finished request's blocks, tail first (so the tail is evicted first)."""
        for block in reversed(pinned):
            count = self._refs.get(block)
            if count is None:
                continue
            if count <= 1:
                self._refs[block] = 0
                self._free[block] = None
            else:
                self._refs[block] = count - 1

    def clear(self) -> list[Hashable]:
        """Drop every unpinned block (vLLM's reset_prefix_cache); returns what went."""
        dropped = list(self._free)
        for block in dropped:
            del self._refs[block]
        self._free.clear()
        return dropped

    def _pin(self, block: Hashable) -> None:
        if self._refs[block] == 0:
            del self._free[block]
        self._refs[block] += 1

    def _make_room(self, evicted: list[Hashable]) -> bool:
        if len(self._refs) < self.capacity_blocks:
            return True
        if not self._free:
            return False
        block, _ = self._free.popitem(last=False)
        del self._refs[block]
        evicted.append(block)
        return True
