"""Routing figures per replica, summed in SQL from ``replica_hours``.

Predicted and ceiling cached tokens are NULL on requests routed before KV-aware routing
recorded them; the rollup counts the requests that carry them, so "no routing data yet"
is a count of zero rather than a guess.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.db.figures.spend import CEILINGS, Ceilings, Scope, bucketer, ratio
from gateway.db.models import ReplicaHourRow

REPLICAS = ReplicaHourRow.__table__
SUMMED = (
    "requests",
    "failed_requests",
    "prompt_tokens",
    "cache_read_tokens",
    "output_tokens",
    "predicted_requests",
    "predicted_cached_tokens",
    "predicted_cache_read_tokens",
    *CEILINGS,
)


@dataclass(frozen=True, slots=True)
class ReplicaFigures(Ceilings):
    """Load and cache figures of one replica (or of a time bucket across replicas)."""

    requests: int = 0
    failed_requests: int = 0
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    output_tokens: int = 0
    predicted_requests: int = 0
    predicted_cached_tokens: int = 0
    # Reported cached tokens of the requests that carry a prediction (like for like).
    predicted_cache_read_tokens: int = 0

    @property
    def hit_rate(self) -> Decimal | None:
        """Cache-read tokens over prompt tokens; None without prompt tokens."""
        return ratio(self.cache_read_tokens, self.prompt_tokens)


def _figures(row: Any) -> ReplicaFigures:
    return ReplicaFigures(**{f.name: int(row[f.name] or 0) for f in fields(ReplicaFigures)})


def _sums() -> list[Any]:
    return [func.sum(REPLICAS.c[name]).label(name) for name in SUMMED]


@dataclass(frozen=True, slots=True)
class Replica:
    model: str
    upstream: str
    figures: ReplicaFigures


def by_replica(session: Session, scope: Scope) -> list[Replica]:
    """Per model x upstream in the scope (replica rollups have no tenant: that filter is moot)."""
    query = (
        select(REPLICAS.c.model, REPLICAS.c.upstream, *_sums())
        .where(*scope.where(REPLICAS, tenants=False))
        .group_by(REPLICAS.c.model, REPLICAS.c.upstream)
        .order_by(REPLICAS.c.model, REPLICAS.c.upstream)
    )
    return [
        Replica(row["model"], row["upstream"], _figures(row))
        for row in session.execute(query).mappings()
    ]


def routing_trend(
    session: Session, scope: Scope, edges: Sequence[datetime]
) -> list[tuple[datetime, ReplicaFigures]]:
    """Fleet-wide routing figures per time bucket (see ``aggregates.trend``)."""
    query = (
        select(REPLICAS.c.hour, *_sums())
        .where(*scope.where(REPLICAS, tenants=False))
        .group_by(REPLICAS.c.hour)
    )
    to_bucket = bucketer(edges)
    sums: dict[datetime, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in session.execute(query).mappings():
        start = to_bucket(row["hour"])
        if start is not None:
            for name in SUMMED:
                sums[start][name] += int(row[name] or 0)
    return [
        (start, _figures(sums[start]) if start in sums else ReplicaFigures())
        for start in edges[:-1]
    ]
