"""Exact replica holdings from vLLM's KV events, and the router's view that falls back to
the approximate index for replicas whose event stream cannot be trusted right now.

`ExactIndex` keeps, per replica, every block hash the replica announced (BlockStored) and
has not withdrawn (BlockRemoved, AllBlocksCleared), with the storage tier (``medium``:
GPU, CPU, ...) each copy sits in. vLLM can hold one hash in two physical blocks at once
(two requests that computed the same prefix in one step) and announces each, so copies are
counted: a hash is held until its last copy is removed.

`RoutingIndex` is what a fleet asks: for a replica whose event consumer is in sync
(``fresh``) the exact holdings together with what this router placed there and the
events have not announced yet (`gateway.routing.predicted`: predict on route); otherwise
the approximate index, which keeps learning from every placement either way so that it
is warm when it is needed. It is the KV event sink: a stored block confirms a
prediction.

Tiers: a matched block is credited by its fastest copy's tier (`gateway.routing.tiers`);
`fetch_blocks` says how many blocks' worth of prefill fetching a match from slower tiers
costs. Replicas that never announced a copy outside GPU memory cost nothing to ask.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.holders import Holders
from gateway.routing.index import ApproximateIndex
from gateway.routing.predicted import PredictedIndex
from gateway.routing.tiers import CPU, GPU, medium_rank


class ExactIndex(Holders[dict[int, dict[str | None, int]]]):
    """Per replica, the blocks its KV events say it holds, by tier."""

    def __init__(self) -> None:
        super().__init__()  # holdings: hash → medium → copies
        # Replicas that announced a copy outside GPU memory: their blocks held only in host
        # memory, and only on disk (or another slower tier), kept as the events come.
        self._slow: dict[str, tuple[set[int], set[int]]] = {}

    # -- KvEventSink ---------------------------------------------------------------------

    def block_stored(
        self, replica: str, hashes: Sequence[int], *, medium: str | None = None
    ) -> None:
        """The replica cached these blocks (one copy each) in ``medium``."""
        held = self._held.get(replica)
        if held is None:
            held = self._add(replica, {})
        if medium_rank(medium) and replica not in self._slow:
            self._slow[replica] = (set(), set())
        slow = self._slow.get(replica)
        bit = self._bits[replica]
        holders = self._holders
        for block in hashes:
            tiers = held.get(block)
            if tiers is None:
                tiers = held[block] = {medium: 1}
                holders[block] = holders.get(block, 0) | bit
            else:
                tiers[medium] = tiers.get(medium, 0) + 1
            if slow is not None:
                _classify(slow, block, tiers)

    def block_removed(
        self, replica: str, hashes: Sequence[int], *, medium: str | None = None
    ) -> None:
        """The replica dropped one copy of each block from ``medium``."""
        held = self._held.get(replica)
        if held is None:
            return
        bit = self._bits[replica]
        slow = self._slow.get(replica)
        for block in hashes:
            tiers = held.get(block)
            if tiers is None:
                continue
            # A removal that names no tier (or a tier we never saw) takes any copy.
            tier = medium if medium in tiers else next(iter(tiers))
            count = tiers[tier] - 1
            if count:
                tiers[tier] = count
                continue
            del tiers[tier]
            if not tiers:
                del held[block]
                self._unhold(block, bit)
            if slow is not None:
                _classify(slow, block, tiers)

    def all_blocks_cleared(self, replica: str) -> None:
        """The replica dropped every cached block (reset, or a new process)."""
        held = self._held.get(replica)
        if held is None:
            return
        bit = self._bits[replica]
        for block in held:
            self._unhold(block, bit)
        held.clear()
        for blocks in self._slow.get(replica, ()):
            blocks.clear()

    # -- BlockIndex ------------------------------------------------------------------------

    def extend(self, replica: str, hashes: Sequence[int], start: int) -> int:
        """Where the run of held blocks from ``start`` ends."""
        return self._extend(replica, hashes, start)

    def fetch_blocks(
        self, replica: str, hashes: Sequence[int], depth: int, weights: Sequence[float]
    ) -> float:
        """Blocks' worth of prefill that fetching the first ``depth`` blocks costs: each
        block held only outside GPU memory costs ``1 - weight`` of its fastest tier
        (``weights`` by `gateway.routing.tiers.medium_rank`); one not held costs nothing
        here (it is a prediction: the placement computes it into GPU memory)."""
        slow = self._slow.get(replica)
        if slow is None or not (slow[0] or slow[1]):
            return 0.0
        window = set(hashes[:depth])
        host, disk = slow
        return (1.0 - weights[1]) * len(host & window) + (1.0 - weights[2]) * len(disk & window)

    def forget(self, replica: str) -> None:
        """Drop a replica and free its slot."""
        self._drop(replica)
        self._slow.pop(replica, None)

    # -- inspection --------------------------------------------------------------------------

    def blocks(self, replica: str) -> frozenset[int]:
        """Every block hash the replica holds."""
        return frozenset(self._held.get(replica, ()))

    def tiers(self, replica: str, block: int) -> dict[str | None, int]:
        """Copies of one block per tier on a replica (empty when not held)."""
        return dict(self._held.get(replica, {}).get(block, {}))


def _classify(slow: tuple[set[int], set[int]], block: int, tiers: dict[str | None, int]) -> None:
    """File a block by its fastest copy: in GPU memory (neither set), host memory, or slower."""
    host, disk = slow
    host.discard(block)
    disk.discard(block)
    if not tiers or GPU in tiers or None in tiers:
        return
    (host if CPU in tiers else disk).add(block)


class RoutingIndex:
    """Exact holdings (and this router's predictions) for replicas whose events are in
    sync, the approximate index else; the KV event sink of every replica."""

    def __init__(
        self,
        approximate: ApproximateIndex,
        exact: ExactIndex | None = None,
        *,
        predicted: PredictedIndex | None = None,
    ) -> None:
        self.approximate = approximate
        self.exact = exact if exact is not None else ExactIndex()
        self.predicted = predicted if predicted is not None else PredictedIndex()
        self._fresh: set[str] = set()

    def set_fresh(self, replica: str, fresh: bool) -> None:
        """Whether the replica's event stream is complete up to now (set by its consumer)."""
        if fresh:
            self._fresh.add(replica)
        else:
            self._fresh.discard(replica)

    def fresh(self, replica: str) -> bool:
        """Whether predictions for the replica come from its own KV events."""
        return replica in self._fresh

    @property
    def fresh_replicas(self) -> frozenset[str]:
        """The replicas whose event streams are complete up to now."""
        return frozenset(self._fresh)

    # -- KvEventSink: the exact index, and predictions confirmed -----------------------

    def block_stored(
        self, replica: str, hashes: Sequence[int], *, medium: str | None = None
    ) -> None:
        """The replica announced blocks: held exactly, predicted no more."""
        self.exact.block_stored(replica, hashes, medium=medium)
        if self.predicted:
            self.predicted.settle(replica, hashes)

    def block_removed(
        self, replica: str, hashes: Sequence[int], *, medium: str | None = None
    ) -> None:
        """The replica evicted blocks: held exactly no more."""
        self.exact.block_removed(replica, hashes, medium=medium)

    def all_blocks_cleared(self, replica: str) -> None:
        """The replica cleared its cache: nothing held or predicted there."""
        self.exact.all_blocks_cleared(replica)
        self.predicted.forget(replica)

    # -- what the router asks ----------------------------------------------------------

    def match(self, replica: str, hashes: Sequence[int]) -> int:
        """Leading blocks the replica holds: exact and predicted if fresh, else approximate."""
        if replica in self._fresh:
            return self._union(replica, hashes, self.exact.match(replica, hashes))
        return self.approximate.match(replica, hashes)

    def match_all(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks held per replica, each counted as ``match`` counts them."""
        fresh = self._fresh
        if not fresh:
            return self.approximate.match_all(hashes)
        found = {}
        if not fresh.issuperset(self.approximate.replicas()):
            found = {r: n for r, n in self.approximate.match_all(hashes).items() if r not in fresh}
        exact = self.exact.match_all(hashes)
        if not self.predicted:
            found.update((r, n) for r, n in exact.items() if r in fresh)
            return found
        predicted = self.predicted.match_all(hashes)
        for replica in exact.keys() | predicted.keys():
            if replica in fresh:
                found[replica] = self._union(replica, hashes, exact.get(replica, 0))
        return found

    def _union(self, replica: str, hashes: Sequence[int], depth: int) -> int:
        """The leading run of blocks held or predicted, from a run ``depth`` long held."""
        predicted, exact = self.predicted, self.exact
        if not predicted:
            return depth
        while True:
            further = predicted.extend(replica, hashes, depth)
            if further == depth:
                return depth
            depth = exact.extend(replica, hashes, further)

    def fetch_blocks(
        self, replica: str, hashes: Sequence[int], depth: int, weights: Sequence[float]
    ) -> float:
        """Blocks' worth of prefill that fetching the match from slower tiers costs."""
        if replica in self._fresh:
            return self.exact.fetch_blocks(replica, hashes, depth, weights)
        return self.approximate.fetch_blocks(replica, hashes, depth, weights)

    def record(
        self, replica: str, hashes: Sequence[int], *, now: float = 0.0, start: int = 0
    ) -> None:
        """A placement: the approximate index learns it (events will confirm it, or not);
        on a replica followed by its events, the blocks from ``start`` (those not known
        held there) are predicted until they do."""
        self.approximate.record(replica, hashes)
        if replica in self._fresh:
            self.predicted.predict(replica, hashes[start:], now=now)

    def expire(self, now: float) -> None:
        """Predictions past their time go."""
        if self.predicted:
            self.predicted.expire(now)

    def correct(
        self, replica: str, hashes: Sequence[int], reported_blocks: int, *, predicted_blocks: int
    ) -> None:
        """The replica's report: the approximate index corrected; blocks it did not have
        are predicted there no more."""
        self.approximate.correct(
            replica, hashes, reported_blocks, predicted_blocks=predicted_blocks
        )
        if reported_blocks < predicted_blocks and self.predicted:
            self.predicted.settle(replica, hashes[reported_blocks:])

    def forget(self, replica: str) -> None:
        """A replica went away: the approximate guesses and the predictions go; its events
        say what it holds."""
        self.approximate.forget(replica)
        self.predicted.forget(replica)
