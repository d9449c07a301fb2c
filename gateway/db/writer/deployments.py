"""Traffic per deployment and endpoint: ``deployment_hours``, kept in the requests' own
transaction.

One row per UTC hour × tenant × model × deployment × price entry × endpoint, with the
attempts' tokens by class and their cost, so the cost to serve (per deployment × tenant ×
hour, ``gateway.db.figures.serving_cost``) and the traffic by endpoint
(``gateway.db.figures.endpoints``) are read from a few rows per hour, not from every
request. Every attempt counts, whatever its status (a failed one took GPU time too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table, text

from gateway.db.models import DeploymentHourRow
from gateway.db.writer.bulk import Deltas

TABLE: Table = DeploymentHourRow.__table__  # type: ignore[assignment]
KEYS = ("hour", "tenant_id", "model", "deployment", "price_id", "endpoint")
TOKENS = ("uncached_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")
SUMMED = ("requests", *TOKENS, "cost_total")
# The hour a request started, as the writer's keys store it, per database (SQLite keeps
# naive UTC text: SQLAlchemy's '2026-10-01 05:00:00.000000').
HOUR = {
    "postgresql": "date_trunc('hour', started_at, 'UTC')",
    "sqlite": "strftime('%Y-%m-%d %H:00:00.000000', started_at)",
}


def deltas(rows: Sequence[Mapping[str, Any]], hours: Sequence[Any]) -> Deltas:
    """What the new request rows (``hours``: each row's UTC hour) add to
    ``deployment_hours``: ``SUMMED`` per ``KEYS``."""
    found: Deltas = {}
    for row, hour in zip(rows, hours, strict=True):
        key = (
            hour,
            row["tenant_id"],
            row["model"],
            row["deployment"],
            row["price_id"] or "",
            row.get("endpoint") or "",
        )
        delta = found.get(key)
        if delta is None:
            found[key] = [1, *(row[name] for name in TOKENS), row["cost_total"]]
        else:
            delta[0] += 1
            for n, name in enumerate(TOKENS, start=1):
                delta[n] += row[name]
            delta[-1] += row["cost_total"]
    return found


def backfill_sql(dialect: str) -> str:
    """The statement that folds every stored request into an empty ``deployment_hours``
    (``dialect``: postgresql or sqlite)."""
    keys = (
        f"{HOUR[dialect]}, tenant_id, model, deployment, coalesce(price_id, ''),"
        " coalesce(endpoint, '')"
    )
    sums = ", ".join(f"sum({name})" for name in (*TOKENS, "cost_total"))
    return (
        f"INSERT INTO {TABLE.name} ({', '.join((*KEYS, *SUMMED))})"
        f" SELECT {keys}, count(*), {sums} FROM requests GROUP BY {keys}"
    )


def backfill(connection: Connection) -> None:
    """Fold every request already stored into ``deployment_hours`` (empty before) in one
    grouped statement: what ``add`` would have made of them (migration 0016)."""
    connection.execute(text(backfill_sql(connection.dialect.name)))
