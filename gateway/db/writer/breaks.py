"""The prefix breakers' rollup: ``break_hours``, kept in the requests' own transaction.

One row per UTC hour × tenant × model × price entry × rate set × break offset × early, so
the ranking of break positions, and what they cost at each request's own rates, is read
from a few rows per position, whatever the traffic (``gateway.db.figures.breaks``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Table

from gateway.db.models import BreakHourRow
from gateway.db.writer.bulk import Deltas

TABLE: Table = BreakHourRow.__table__  # type: ignore[assignment]
KEYS = ("hour", "tenant_id", "model", "price_id", "rate_class", "break_tokens", "early")
SUMMED = ("requests", "lost_tokens", "prompt_tokens")
# The request columns read (migrations rebuilding at an older revision read them as NULL).
COLUMNS = ("rate_class", "break_tokens", "lost_tokens", "break_early")


def deltas(rows: Sequence[Mapping[str, Any]], hours: Sequence[Any]) -> Deltas:
    """What the new request rows that broke (``hours``: each row's UTC hour) add to
    ``break_hours``: ``SUMMED`` per ``KEYS``."""
    found: Deltas = {}
    for row, hour in zip(rows, hours, strict=True):
        offset = row.get("break_tokens")
        if offset is None:
            continue
        key = (
            hour,
            row["tenant_id"],
            row["model"],
            row["price_id"] or "",
            row.get("rate_class") or "",
            offset,
            bool(row.get("break_early")),
        )
        prompt = row["uncached_tokens"] + row["cache_read_tokens"] + row["cache_write_tokens"]
        delta = found.setdefault(key, [0, 0, 0])
        delta[0] += 1
        delta[1] += row["lost_tokens"] or 0
        delta[2] += prompt
    return found
