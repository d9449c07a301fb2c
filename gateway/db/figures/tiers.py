"""Cached tokens by cache tier per replica, summed in SQL from ``replica_hours``.

Only requests whose replica reported where its cached tokens came from count
(``tier_requests``): GPU memory's share is what the rest of their cached tokens is, so
a replica that does not say (vLLM 0.32 reports tiers in /metrics only) shows nothing
rather than an all-GPU guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.db.figures.spend import Scope, ratio
from gateway.db.models import ReplicaHourRow

REPLICAS = ReplicaHourRow.__table__
SUMMED = ("tier_requests", "tier_cache_read_tokens", "host_cached_tokens", "disk_cached_tokens")


@dataclass(frozen=True, slots=True)
class TierFigures:
    """One replica's cached tokens by tier, over the requests that reported them."""

    model: str
    upstream: str
    requests: int = 0
    cached_tokens: int = 0
    host_tokens: int = 0
    disk_tokens: int = 0

    @property
    def gpu_tokens(self) -> int:
        """Cached tokens found in GPU memory: those read from neither host nor disk."""
        return self.cached_tokens - self.host_tokens - self.disk_tokens

    def share(self, tokens: int) -> Decimal | None:
        """A tier's share of the cached tokens."""
        return ratio(tokens, self.cached_tokens)


def by_replica(session: Session, scope: Scope) -> list[TierFigures]:
    """Per model x upstream that reported tiers in the scope (no tenant: replica rollups)."""
    sums = [func.sum(REPLICAS.c[name]).label(name) for name in SUMMED]
    query = (
        select(REPLICAS.c.model, REPLICAS.c.upstream, *sums)
        .where(*scope.where(REPLICAS, tenants=False))
        .group_by(REPLICAS.c.model, REPLICAS.c.upstream)
        .having(func.sum(REPLICAS.c.tier_requests) > 0)
        .order_by(REPLICAS.c.model, REPLICAS.c.upstream)
    )
    return [
        TierFigures(
            model=row["model"],
            upstream=row["upstream"],
            requests=int(row["tier_requests"]),
            cached_tokens=int(row["tier_cache_read_tokens"]),
            host_tokens=int(row["host_cached_tokens"]),
            disk_tokens=int(row["disk_cached_tokens"]),
        )
        for row in session.execute(query).mappings()
    ]
