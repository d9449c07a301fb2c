"""The hit-rate ceiling: what a perfect router with an infinite cache would have hit.

Every block hash the fleet has seen, per cache scope (a tenant's salt, or a sharing
group), as if one replica with unbounded memory had served all traffic. A block of a
request counts towards the ceiling when it and every block before it had been seen
earlier, which is exactly when an infinite prefix cache would have served it. Routing
efficiency is the hit rate achieved divided by this ceiling.

"Infinite" is bounded all the same, so that a long-running gateway's memory is: past
``max_entries`` the least recently seen block is forgotten. With the default (a million
entries, about 200 MiB) that only matters for blocks no cache of any realistic size
would still hold.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

DEFAULT_MAX_ENTRIES = 1_000_000


class HitCeiling:
    """Seen block hashes per scope, LRU-bounded by ``max_entries`` in all."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._seen: OrderedDict[tuple[Hashable, int], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, scope: Hashable, hashes: Sequence[int]) -> int:
        """Leading blocks seen before in this scope; then remember all of them as seen."""
        seen = self._seen
        keys = [(scope, block) for block in hashes]
        ceiling = 0
        for key in keys:
            if key not in seen:
                break
            ceiling += 1
        # Tail first, so that when memory runs out a prompt's tail is forgotten first.
        for key in reversed(keys):
            if key in seen:
                seen.move_to_end(key)
            else:
                seen[key] = None
        while len(seen) > self.max_entries:
            seen.popitem(last=False)
        return ceiling
