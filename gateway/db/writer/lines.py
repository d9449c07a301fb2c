"""Statement lines: ``statement_lines`` and ``statement_cells``, kept in the requests' own
transaction.

    requests rows ──▶ statement_lines   sums per UTC day × tenant × model × endpoint ×
                 │                      price entry × rate set × usage source
                 └──▶ statement_cells   (line, interaction) of each completed attempt: a
                                        line's completed interactions count each once

A batch's lines are upserted first (their sums added, their ids returned), then its
completed attempts' cells are inserted, and each line's count grows by the cells that were
new. Rows are written in key order (lines) and id order (cells), as every rollup is, so
concurrent writers cannot deadlock; a cell is only ever inserted by a writer that holds its
line's row lock, so two writers never both count one interaction.

A line's key columns are NOT NULL (upserts must find their row): no endpoint kept, no
price entry and no rate set are ``''`` there, NULL again when read
(``gateway.db.statements.rolled_lines``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

import orjson
from sqlalchemy import Connection, Table, bindparam, text, update

from gateway.db import sums
from gateway.db.models import LINE_KEYS, StatementCellRow, StatementLineRow
from gateway.db.writer import bulk

LINES: Table = StatementLineRow.__table__  # type: ignore[assignment]
CELLS: Table = StatementCellRow.__table__  # type: ignore[assignment]
SUMMED = ("requests", *sums.TOKENS, *sums.COSTS)
COMPLETED = "completed"
# The UTC day a request (table alias r) started, per database (SQLite keeps naive UTC text).
DAY = {
    "postgresql": "(r.started_at AT TIME ZONE 'UTC')::date",
    "sqlite": "date(r.started_at)",
}
# A line's key from a request's columns (table alias r), as the line stores it.
KEY_SQL = {
    "tenant_id": "r.tenant_id",
    "model": "r.model",
    "endpoint": "coalesce(r.endpoint, '')",
    "price_id": "coalesce(r.price_id, '')",
    "rate_class": "coalesce(r.rate_class, '')",
    "usage_source": "r.usage_source",
}

Key = tuple[Any, ...]  # a line's LINE_KEYS values
# Postgres: a batch's cells inserted (in id order, from one JSON document) and each line's
# count grown by the cells that were new, in one statement; the lines' rows are this
# transaction's already (their upsert), so it waits on no other writer's row.
COUNT_NEW_CELLS = (
    f"WITH new AS (INSERT INTO {CELLS.name} (line_id, interaction_id)"
    f" SELECT line_id, interaction_id FROM json_populate_recordset(NULL::{CELLS.name}, %s::json)"
    " ON CONFLICT DO NOTHING RETURNING line_id)"
    f" UPDATE {LINES.name} SET completed_interactions = completed_interactions + new_cells.n"
    " FROM (SELECT line_id, count(*) AS n FROM new GROUP BY line_id) AS new_cells"
    f" WHERE {LINES.name}.id = new_cells.line_id"
)


def key_of(row: Mapping[str, Any], day: date) -> Key:
    """The statement line a request row (``record_row``'s dict) falls in."""
    return (
        row["tenant_id"],
        day,
        row["model"],
        row.get("endpoint") or "",
        row["price_id"] or "",
        row.get("rate_class") or "",
        row["usage_source"],
    )


def add(connection: Connection, rows: Sequence[Mapping[str, Any]], days: Sequence[date]) -> None:
    """Fold newly inserted request rows (``days``: each row's UTC day) into the lines."""
    deltas: dict[Key, list[Any]] = {}
    completed: dict[Key, set[str]] = {}
    for row, day in zip(rows, days, strict=True):
        key = key_of(row, day)
        delta = deltas.get(key)
        if delta is None:
            deltas[key] = [1, *(row[name] for name in SUMMED[1:])]
        else:
            delta[0] += 1
            for n, name in enumerate(SUMMED[1:], start=1):
                delta[n] += row[name]
        if row["status"] == COMPLETED:
            completed.setdefault(key, set()).add(row["interaction_id"])
    if not deltas:
        return
    written = bulk.insert_rows(
        connection,
        LINES,
        [
            {
                **dict(zip(LINE_KEYS, key, strict=True)),
                **dict(zip(SUMMED, values, strict=True)),
                "completed_interactions": 0,
            }
            for key, values in sorted(deltas.items())
        ],
        conflict=LINE_KEYS,
        add=SUMMED,
        returning=("id", *LINE_KEYS),
    )
    if not completed:
        return
    ids = {_key(found[1:]): found[0] for found in written}
    cells = sorted(
        (ids[key], interaction)
        for key, interactions in completed.items()
        for interaction in interactions
    )
    if connection.dialect.name == "postgresql":
        # One statement: the cells, and each line's count grown by those that were new.
        document = orjson.dumps([{"line_id": i, "interaction_id": n} for i, n in cells]).decode()
        connection.exec_driver_sql(COUNT_NEW_CELLS, (document,))
        return
    new = bulk.insert_rows(
        connection,
        CELLS,
        [{"line_id": line, "interaction_id": interaction} for line, interaction in cells],
        conflict=None,
        returning=("line_id",),
    )
    counts = Counter(line for (line,) in new)
    if counts:
        connection.execute(
            update(LINES)
            .where(LINES.c.id == bindparam("line"))
            .values(completed_interactions=LINES.c.completed_interactions + bindparam("n"))
            .execution_options(synchronize_session=False),
            [{"line": line, "n": n} for line, n in sorted(counts.items())],
        )


def _key(values: Sequence[Any]) -> Key:
    """A returned line's key as ``key_of`` makes it (the day a ``date`` on both databases)."""
    day = values[1]
    if isinstance(day, str):
        day = date.fromisoformat(day)
    return (values[0], day, *values[2:])


def backfill_sql(dialect: str) -> tuple[str, str, str]:
    """The statements that fold every stored request into empty ``statement_lines`` and
    ``statement_cells`` (``dialect``: postgresql or sqlite): the lines' sums, their cells,
    then their counts of cells."""
    keys = {**KEY_SQL, "day": DAY[dialect]}
    grouped = ", ".join(keys[name] for name in LINE_KEYS)
    summed = ", ".join("count(*)" if name == "requests" else f"sum(r.{name})" for name in SUMMED)
    lines = (
        f"INSERT INTO {LINES.name} ({', '.join((*LINE_KEYS, *SUMMED))}, completed_interactions)"
        f" SELECT {grouped}, {summed}, 0 FROM requests r GROUP BY {grouped}"
    )
    matched = " AND ".join(f"l.{name} = {keys[name]}" for name in LINE_KEYS)
    cells = (
        f"INSERT INTO {CELLS.name} (line_id, interaction_id)"
        f" SELECT DISTINCT l.id, r.interaction_id FROM requests r JOIN {LINES.name} l"
        f" ON {matched} WHERE r.status = '{COMPLETED}'"
    )
    counts = (
        f"UPDATE {LINES.name} SET completed_interactions ="
        f" (SELECT count(*) FROM {CELLS.name} c WHERE c.line_id = {LINES.name}.id)"
    )
    return lines, cells, counts


def backfill(connection: Connection) -> None:
    """Fold every request already stored into the empty statement lines and cells: what
    ``add`` would have made of them (migration 0019)."""
    for statement in backfill_sql(connection.dialect.name):
        connection.execute(text(statement))
