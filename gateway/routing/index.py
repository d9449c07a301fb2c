"""Which replica holds which blocks: the router's picture of the fleet's prefix caches.

Two ways to know, one interface (`BlockIndex`) for the policy's caller:

- approximate (`ApproximateIndex`, here): the index learns from its own routing decisions
  (a request routed to a replica leaves its blocks there) and keeps, per replica, an LRU
  bounded by the replica's capacity in blocks, which mirrors vLLM's LRU free queue. It
  corrects itself from the ``cached_tokens`` each response reports.
- exact (`gateway.routing.exact`): fed by vLLM's KV events (BlockStored / BlockRemoved /
  AllBlocksCleared), it implements `BlockIndex` and `KvEventSink` and needs no guessing.

Matching a prompt against every replica is the hot path. Each block hash maps to a bit
mask of the replicas holding it, so `match_all` walks the prompt's chain once, however
many replicas there are, and stops as soon as no replica holds the next block.

Tiers (a deployment's ``cpu_blocks`` / ``disk_blocks``): the approximate index mirrors
the replica's tiers as the simulated replica keeps them (`gateway.tools.sim.cache`): what
its GPU LRU evicts moves to a host-memory LRU, what that evicts to a disk LRU; a block
placed again moves back up. A match counts blocks in any tier; `fetch_blocks` says what
the slower tiers' share of it costs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import KeysView, Mapping, Sequence
from typing import Protocol

from gateway.routing.holders import Holders


class BlockIndex(Protocol):
    """What the router asks of an index, approximate or exact."""

    def match(self, replica: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica is believed to hold."""
        ...

    def match_all(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks held, per replica; replicas holding none are left out."""
        ...

    def forget(self, replica: str) -> None:
        """Drop everything known about a replica (it left, restarted or was reset)."""
        ...


class KvEventSink(Protocol):
    """What an exact index (gateway/routing/exact.py) takes from vLLM's KV event stream;
    ``medium`` is the storage tier the event names (GPU, CPU, ...), when it names one."""

    def block_stored(
        self, replica: str, hashes: Sequence[int], *, medium: str | None = None
    ) -> None:
        """The replica stored these blocks (in ``medium``, where the event says)."""

    def block_removed(
        self, replica: str, hashes: Sequence[int], *, medium: str | None = None
    ) -> None:
        """The replica removed these blocks (from ``medium``, where the event says)."""

    def all_blocks_cleared(self, replica: str) -> None:
        """The replica cleared its whole cache."""


class ApproximateIndex(Holders[OrderedDict[int, None]]):
    """Per-replica LRU of the blocks this router sent there, bounded by capacity."""

    def __init__(
        self,
        capacity_blocks: int,
        *,
        capacities: Mapping[str, int] | None = None,
        lower: Sequence[int] = (),
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be at least 1")
        if any(blocks < 1 for blocks in lower):
            raise ValueError("a lower tier needs at least 1 block")
        super().__init__()  # holdings: the GPU LRU of each replica
        self._default_capacity = capacity_blocks
        self._capacities = dict(capacities or {})
        self.lower_capacity = tuple(lower)  # per replica: host memory, then disk
        self._lower: dict[str, list[OrderedDict[int, None]]] = {}
        # With lower tiers a match counts blocks in any tier, which the masks say.
        self._walk_alone = not self.lower_capacity

    def __len__(self) -> int:
        return sum(len(lru) for lru in self._held.values())

    def replicas(self) -> KeysView[str]:
        """The replicas it has learned anything about."""
        return self._held.keys()

    def blocks(self, replica: str) -> int:
        """How many blocks the replica is believed to hold."""
        lru = self._held.get(replica)
        return 0 if lru is None else len(lru)

    def match(self, replica: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica is believed to hold."""
        if replica not in self._held:
            return 0
        if self.lower_capacity:
            bit, holders = self._bits[replica], self._holders
            hits = 0
            for block in hashes:
                if not holders.get(block, 0) & bit:
                    break
                hits += 1
            return hits
        return super().match(replica, hashes)

    def fetch_blocks(
        self, replica: str, hashes: Sequence[int], depth: int, weights: Sequence[float]
    ) -> float:
        """Blocks' worth of prefill that fetching the first ``depth`` blocks from the
        slower tiers costs: ``1 - weight`` of each (``weights``: GPU, host, disk)."""
        lower = self._lower.get(replica)
        if not lower:
            return 0.0
        lru = self._held[replica]
        cost = 0.0
        for i in range(min(depth, len(hashes))):
            block = hashes[i]
            if block in lru:
                continue
            for rank, tier in enumerate(lower, 1):
                if block in tier:
                    cost += 1.0 - weights[rank]
                    break
        return cost

    def record(self, replica: str, hashes: Sequence[int]) -> None:
        """The request with these blocks was sent to the replica: it will hold them."""
        lru = self._held.get(replica)
        if lru is None:
            lru = self._add_lru(replica)
        bit = self._bits[replica]
        holders = self._holders
        capacity = self._capacities.get(replica, self._default_capacity)
        lower = self._lower.get(replica)
        # Tail first, so the head ends most recent: vLLM frees a request's blocks tail
        # first, and its LRU evicts the tail of a prompt before the head.
        for block in reversed(hashes):
            if block in lru:
                lru.move_to_end(block)
                continue
            lru[block] = None
            if lower:
                if holders.get(block, 0) & bit:
                    for tier in lower:  # placed again: back up from a lower tier
                        if tier.pop(block, 0) is None:
                            break
                else:
                    holders[block] = holders.get(block, 0) | bit
                if len(lru) > capacity:
                    self._offload(lower, lru.popitem(last=False)[0], bit)
                continue
            holders[block] = holders.get(block, 0) | bit
            if len(lru) > capacity:
                old, _ = lru.popitem(last=False)
                self._unhold(old, bit)

    def _offload(self, lower: list[OrderedDict[int, None]], block: int, bit: int) -> None:
        """A block out of GPU memory into host memory, pushing the oldest on down."""
        for tier, capacity in zip(lower, self.lower_capacity, strict=True):
            tier[block] = None
            if len(tier) <= capacity:
                return
            block, _ = tier.popitem(last=False)
        self._unhold(block, bit)

    def correct(
        self,
        replica: str,
        hashes: Sequence[int],
        reported_blocks: int,
        *,
        predicted_blocks: int,
    ) -> None:
        """Fold in what the replica reported it had cached of a request it served.

        Fewer blocks than predicted means the replica evicted what we believed it held:
        its blocks from the first miss onward are dropped, so that later requests of the
        chain stop being drawn to it on a promise it cannot keep. More than predicted
        means it holds what this router did not send (another gateway instance did):
        the reported prefix is learned.
        """
        if reported_blocks < predicted_blocks:
            lru = self._held.get(replica)
            if lru is None:
                return
            bit = self._bits[replica]
            tiers = [lru, *self._lower.get(replica, ())]
            for block in hashes[reported_blocks:]:
                for tier in tiers:
                    if block in tier:
                        del tier[block]
                        self._unhold(block, bit)
                        break
        elif reported_blocks > predicted_blocks:
            self.record(replica, hashes[:reported_blocks])

    def forget(self, replica: str) -> None:
        """Drop everything known about a replica and free its slot."""
        dropped = self._drop(replica)
        if dropped is None:
            return
        bit = dropped[1]
        for tier in self._lower.pop(replica, ()):
            for block in tier:
                self._unhold(block, bit)

    def _add_lru(self, replica: str) -> OrderedDict[int, None]:
        lru: OrderedDict[int, None] = self._add(replica, OrderedDict())
        if self.lower_capacity:
            self._lower[replica] = [OrderedDict() for _ in self.lower_capacity]
        return lru
