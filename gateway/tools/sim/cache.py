"""vLLM's automatic prefix cache as a model: chained block hashes, full blocks, LRU, and
optionally slower tiers below it (host memory, disk) as vLLM's offloading connectors add.

Used by the simulated replica (``kvgate sim``) and by the offline replay, so both see the
same cache. What it keeps from vLLM:

- a block is known by its chained hash; only full blocks are cached;
- a request hits the leading run of blocks that are held (the first miss ends the run);
- blocks in use by a running request are pinned (reference counted) and never evicted;
- freed blocks join an LRU free queue; a request's blocks are freed tail first, so within
  one request the tail is evicted before the head;
- eviction takes the least recently freed block, only when a new block needs the room.

Lower tiers (``lower``: block capacities, host first): a block evicted from GPU memory
moves to the first lower tier, that tier's least recently used block to the next, and
the last tier's falls out. A hit in a lower tier loads the block back into GPU memory
(out of the lower tier: each block is in one tier at a time, so the tiers together hold
their combined capacity). The hit counts as cached, as vLLM counts a connector's hit;
`Admission.hit_tiers` says where each hit block came from (0 GPU, 1 the first lower tier, ...).
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
    stored: list[Hashable] = field(default_factory=list)  # into GPU memory (new or loaded)
    evicted: list[Hashable] = field(default_factory=list)  # out of GPU memory
    hit_tiers: list[int] = field(default_factory=list)  # per hit block: the tier it was in
    # Lower tiers' changes in order: (tier, stored?, block), tier 1 the first lower tier.
    moves: list[tuple[int, bool, Hashable]] = field(default_factory=list)


class PrefixCache:
    """A fixed number of KV blocks, named by chained hashes, with optional lower tiers."""

    def __init__(self, capacity_blocks: int, *, lower: Sequence[int] = ()) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be at least 1")
        if any(blocks < 1 for blocks in lower):
            raise ValueError("a lower tier needs at least 1 block")
        self.capacity_blocks = capacity_blocks
        self._refs: dict[Hashable, int] = {}
        self._free: OrderedDict[Hashable, None] = OrderedDict()
        self.lower_capacity = tuple(lower)
        self._lower: list[OrderedDict[Hashable, None]] = [OrderedDict() for _ in lower]

    def __len__(self) -> int:
        return len(self._refs)

    def __contains__(self, block: Hashable) -> bool:
        return block in self._refs

    def blocks(self) -> list[Hashable]:
        """Every block held in GPU memory, pinned or free."""
        return list(self._refs)

    def tier_blocks(self, tier: int) -> list[Hashable]:
        """Every block a lower tier holds (tier 1 the first lower tier)."""
        return list(self._lower[tier - 1])

    @property
    def usage(self) -> float:
        """Share of blocks pinned by running requests (vLLM's kv_cache_usage_perc)."""
        return (len(self._refs) - len(self._free)) / self.capacity_blocks

    def tier_of(self, block: Hashable) -> int | None:
        """The tier holding a block (0 GPU), or None."""
        if block in self._refs:
            return 0
        for tier, lru in enumerate(self._lower, 1):
            if block in lru:
                return tier
        return None

    def match(self, blocks: Sequence[Hashable]) -> int:
        """How many leading blocks are held now, in any tier, without touching recency."""
        if self._lower:
            return len(self._hit_tiers(blocks))
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
        if not self._lower:
            admission = Admission(hit_blocks=self.match(blocks))
            admission.hit_tiers = [0] * admission.hit_blocks
            for block in blocks:
                if not self._take(block, admission):
                    break
            return admission
        return self._admit_tiered(blocks)

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
        """Drop every unpinned GPU block and every lower tier's (vLLM's
        reset_prefix_cache); returns the GPU blocks that went."""
        dropped = list(self._free)
        for block in dropped:
            del self._refs[block]
        self._free.clear()
        for lru in self._lower:
            lru.clear()
        return dropped

    def _admit_tiered(self, blocks: Sequence[Hashable]) -> Admission:
        tiers = self._hit_tiers(blocks)
        admission = Admission(hit_blocks=len(tiers), hit_tiers=tiers)
        # Take the hit blocks out of the lower tiers first, so that making room for one
        # cannot push another one of them further down, or out.
        for block, tier in zip(blocks, tiers, strict=False):
            if tier:
                del self._lower[tier - 1][block]
                admission.moves.append((tier, False, block))
        for index, block in enumerate(blocks):
            if not self._take(block, admission):
                # No GPU room: a loaded block goes back where it was; the hit ends here.
                for back in range(index, admission.hit_blocks):
                    tier = tiers[back]
                    if tier:
                        self._lower[tier - 1][blocks[back]] = None
                        admission.moves.append((tier, True, blocks[back]))
                del tiers[index:]
                admission.hit_blocks = len(tiers)
                break
        return admission

    def _take(self, block: Hashable, admission: Admission) -> bool:
        """Pin a block held, or store a new one where room can be made; False when none."""
        if block in self._refs:
            self._pin(block)
        elif self._make_room(admission):
            self._refs[block] = 1
            admission.stored.append(block)
        else:
            return False
        admission.pinned.append(block)
        return True

    def _hit_tiers(self, blocks: Sequence[Hashable]) -> list[int]:
        tiers: list[int] = []
        refs, lower = self._refs, self._lower
        for block in blocks:
            if block in refs:
                tiers.append(0)
                continue
            for tier, lru in enumerate(lower, 1):
                if block in lru:
                    tiers.append(tier)
                    break
            else:
                break
        return tiers

    def _pin(self, block: Hashable) -> None:
        if self._refs[block] == 0:
            del self._free[block]
        self._refs[block] += 1

    def _make_room(self, admission: Admission) -> bool:
        if len(self._refs) < self.capacity_blocks:
            return True
        if not self._free:
            return False
        block, _ = self._free.popitem(last=False)
        del self._refs[block]
        admission.evicted.append(block)
        self._offload(block, 1, admission)
        return True

    def _offload(self, block: Hashable, tier: int, admission: Admission) -> None:
        """A block pushed out of the tier above goes into ``tier``, pushing its oldest on."""
        while tier <= len(self._lower):
            lru = self._lower[tier - 1]
            lru[block] = None
            admission.moves.append((tier, True, block))
            if len(lru) <= self.lower_capacity[tier - 1]:
                return
            block, _ = lru.popitem(last=False)
            admission.moves.append((tier, False, block))
            tier += 1
