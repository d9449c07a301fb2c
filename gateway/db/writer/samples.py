"""Replica counter samples: written by the gateways' load pollers, off the request path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Table, delete

from gateway.db.models import ReplicaSampleRow
from gateway.db.writer import bulk

TABLE: Table = ReplicaSampleRow.__table__  # type: ignore[assignment]
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens")


def insert_samples(engine: Engine, rows: Sequence[Mapping[str, Any]]) -> int:
    """Store readings (upstream, sampler, sampled_at and the ``COUNTERS``); a reading
    already there (same upstream, sampler and moment) is kept as it was."""
    if not rows:
        return 0
    with engine.begin() as connection:
        made = bulk.insert_rows(
            connection,
            TABLE,
            list(rows),
            conflict=["upstream", "sampler", "sampled_at"],
            returning=["upstream"],
        )
    return len(made)


def prune_samples(engine: Engine, *, before: datetime) -> int:
    """Delete readings taken before ``before``; how many went."""
    with engine.begin() as connection:
        result = connection.execute(delete(TABLE).where(TABLE.c.sampled_at < before))
    return int(result.rowcount or 0)
