"""The database writer's side: requests inserted in bulk, the hourly rollups in the same
transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine

from gateway.db.models import RequestRow
from gateway.db.writer import bulk, rollups


def insert_requests(engine: Engine, rows: Sequence[Mapping[str, Any]]) -> int:
    """Insert request rows; rows already present (same request id) are left as they are.

    The hourly rollups take only the rows this insert created (RETURNING), in the same
    transaction: a replayed record changes neither requests nor rollups. Returns how many
    rows were new.
    """
    if not rows:
        return 0
    by_id = {row["request_id"]: row for row in rows}
    with engine.begin() as connection:
        inserted = bulk.insert_rows(
            connection,
            RequestRow.__table__,  # type: ignore[arg-type]
            list(by_id.values()),
            conflict=["request_id"],
            returning=["request_id"],
        )
        rollups.add(connection, [by_id[request_id] for (request_id,) in inserted])
    return len(inserted)
