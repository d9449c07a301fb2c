"""Predict on route: what a placement will put on its replica, believed for a few seconds.

A replica whose KV events are followed (exact mode) announces a prompt's blocks only
once it has scheduled the request; until then a burst of siblings (the same new system
prompt, an agent fanning out) would see no holder and scatter over the fleet, each
computing the prefix. So every placement on such a replica goes in here, keyed like the
other indexes (block hash → bit mask of replicas) and matched together with the exact
holdings (`gateway.routing.exact.RoutingIndex`), until:

- the replica's KV events confirm a block (BlockStored): the exact index holds it now;
- the replica's own report contradicts it (fewer cached tokens than predicted: the
  blocks from the first miss on were not there), or the replica goes away or is reset;
- or ``ttl_s`` passes (a block never stored: the request failed, the cache was full).

No clock: time is passed in. Expiry is lazy, from a queue in expiry order (the TTL is the
same for every entry, so the queue is sorted by construction).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from gateway.routing.holders import Holders

DEFAULT_PREDICTION_TTL_S = 5.0


class PredictedIndex(Holders[dict[int, float]]):
    """Blocks placed on replicas and not yet confirmed, each until its expiry."""

    _walk_alone = False  # predictions are short runs: the mask walk alone serves them

    def __init__(self, ttl_s: float = DEFAULT_PREDICTION_TTL_S) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        super().__init__()  # holdings: block → expiry
        self.ttl_s = ttl_s
        self._queue: deque[tuple[float, str, tuple[int, ...]]] = deque()

    def __len__(self) -> int:
        return sum(len(held) for held in self._held.values())

    def __bool__(self) -> bool:
        return bool(self._holders)

    def predict(self, replica: str, hashes: Sequence[int], *, now: float) -> None:
        """A placement: the replica will hold these blocks (until ``now + ttl_s``)."""
        if not hashes:
            return
        held = self._held.get(replica)
        if held is None:
            held = self._add(replica, {})
        bit = self._bits[replica]
        holders = self._holders
        expires = now + self.ttl_s
        for block in hashes:
            if block not in held:
                holders[block] = holders.get(block, 0) | bit
            held[block] = expires
        self._queue.append((expires, replica, tuple(hashes)))

    def expire(self, now: float) -> None:
        """Forget the predictions whose time has passed."""
        queue = self._queue
        while queue and queue[0][0] <= now:
            expires, replica, hashes = queue.popleft()
            held = self._held.get(replica)
            if held is None:
                continue
            bit = self._bits[replica]
            for block in hashes:
                # A block predicted again later keeps its later expiry.
                if held.get(block) == expires:
                    del held[block]
                    self._unhold(block, bit)

    def settle(self, replica: str, hashes: Sequence[int]) -> None:
        """These blocks are predictions no more: the replica's events announced them, or
        its report said they were not there."""
        held = self._held.get(replica)
        if not held:
            return
        bit = self._bits[replica]
        for block in hashes:
            if held.pop(block, None) is not None:
                self._unhold(block, bit)

    def forget(self, replica: str) -> None:
        """Drop every prediction about a replica (it left, restarted or was reset)."""
        self._drop(replica)

    def extend(self, replica: str, hashes: Sequence[int], start: int) -> int:
        """Where the run of predicted blocks from ``start`` ends."""
        return self._extend(replica, hashes, start)
