"""The hit-rate ceiling: what a perfect router with an infinite cache would have hit.

Every block hash the fleet has seen, per cache scope (a tenant's salt, or a sharing
group), as if one replica with unbounded memory had served all traffic. A block of a
request counts towards the ceiling when it and every block before it had been seen
earlier, which is exactly when an infinite prefix cache would have served it. Routing
efficiency is the hit rate achieved divided by this ceiling.

"Infinite" is bounded all the same, so that a long-running gateway's memory is: past
``max_entries`` the least recently seen block is forgotten. With the default (a million
entries, about 100 MiB) that only matters for blocks no cache of any realistic size
would still hold.

Blocks are kept as one int each: the block hash XOR a 64-bit key of its scope (block
hashes are uniform 64-bit values, so two scopes' blocks collide with odds of about one in
2^64 per pair), which costs a third less per request than a (scope, hash) tuple each.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import xxhash

DEFAULT_MAX_ENTRIES = 1_000_000


class HitCeiling:
    """Seen block hashes per scope, LRU-bounded by ``max_entries`` in all."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._scopes: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, scope: Hashable, hashes: Sequence[int]) -> int:
        """Leading blocks seen before in this scope; then remember all of them as seen."""
        seen = self._seen
        key = self._key(scope)
        keys = [block ^ key for block in hashes]
        ceiling = 0
        for k in keys:
            if k not in seen:
                break
            ceiling += 1
        self._remember(keys, ceiling)
        return ceiling

    def seen(self, scope: Hashable, hashes: Sequence[int]) -> None:
        """Remember blocks as seen without asking (a replica's KV events announced them:
        another gateway instance's traffic, or blocks its answers filled)."""
        key = self._key(scope)
        self._remember([block ^ key for block in hashes], 0)

    def _remember(self, keys: list[int], known: int) -> None:
        """Every key as most recently seen, tail first (so that when memory runs out a
        prompt's tail is forgotten first); the first ``known`` are held already."""
        seen = self._seen
        move = seen.move_to_end
        keys.reverse()
        split = len(keys) - known
        for k in keys[:split]:
            if k in seen:
                move(k)
            else:
                seen[k] = None
        for k in keys[split:]:
            move(k)
        while len(seen) > self.max_entries:
            seen.popitem(last=False)

    def _key(self, scope: Hashable) -> int:
        key = self._scopes.get(scope)
        if key is None:
            key = self._scopes[scope] = xxhash.xxh3_64_intdigest(repr(scope).encode())
        return key
