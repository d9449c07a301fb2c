"""Hourly rollups: what the dashboard reads instead of scanning every request.

The recorder calls ``add`` in the transaction that inserted the requests, with only the
rows that insert actually created (``RETURNING``), so a record replayed from the journal
never counts twice and rollups and requests commit or roll back together.

    requests rows ──▶ usage_hours        sums per hour x tenant x model x price x status
                 ├──▶ replica_hours      load and cache figures per hour x model x replica
                 ├──▶ ttft_hours         log-bucket TTFT histogram per hour x tenant x model
                 ├──▶ break_hours        prefix breaks per hour x tenant x model x offset
                 │                       (gateway/db/writer/breaks.py)
                 ├──▶ deployment_hours   tokens and cost per hour x tenant x deployment x
                 │                       endpoint (gateway/db/writer/deployments.py)
                 ├──▶ statement_lines    a statement's lines per UTC day, with their
                 │    statement_cells    completed interactions (gateway/db/writer/lines.py)
                 └──▶ interaction_cells  (tenant, interaction, model, hour) with a completion,
                      interactions       so distinct completed interactions stay exact (and
                                         those a priced attempt completed: ``priced`` cells)

Sums are exact: tokens are integers and money is ``Money`` (integer nano-units on SQLite).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Integer,
    Table,
    bindparam,
    inspect,
    literal,
    null,
    select,
    tuple_,
    update,
)

from gateway.db import sums
from gateway.db.models import (
    BreakHourRow,
    DeploymentHourRow,
    InteractionCellRow,
    InteractionRow,
    ReplicaHourRow,
    RequestRow,
    StatementCellRow,
    StatementLineRow,
    TtftHourRow,
    UsageHourRow,
)
from gateway.db.writer import breaks, bulk, deployments, lines

COMPLETED = "completed"
UNPRICED = ""  # price_id of unpriced requests in rollup keys (key columns cannot be NULL)
BUCKETS_PER_DOUBLING = 8
LOWEST_BUCKET = -80  # 2**-10 ms: anything faster is "instant"
HIGHEST_BUCKET = 160  # 2**20 ms, about 17 minutes
READ_COLUMNS = (
    "request_id",
    "tenant_id",
    "interaction_id",
    "model",
    "deployment",
    "endpoint",
    "upstream",
    "started_at",
    "first_token_at",
    "status",
    "usage_source",
    "rate_class",
    *sums.TOKENS,
    "predicted_cached_tokens",
    "ceiling_cached_tokens",
    "ceiling_exact",
    "price_id",
    *sums.COSTS,
    *breaks.COLUMNS,
)
# Read when the requests table has them (since migration 0009_tiers).
TIER_COLUMNS = ("cache_read_host_tokens", "cache_read_disk_tokens")

Row = Mapping[str, Any]


def hour_of(moment: datetime) -> datetime:
    """The UTC hour a moment falls in."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ttft_bucket(ttft: timedelta) -> int:
    """The histogram bucket k holding ``ttft``: 2**(k/8) ms <= ttft < 2**((k+1)/8) ms."""
    micros = ttft // timedelta(microseconds=1)
    if micros <= 0:
        return LOWEST_BUCKET
    bucket = math.floor(BUCKETS_PER_DOUBLING * math.log2(micros / 1000))
    return min(max(bucket, LOWEST_BUCKET), HIGHEST_BUCKET)


def bucket_upper_ms(bucket: int) -> float:
    """The upper edge of a TTFT bucket, in milliseconds."""
    return float(2 ** ((bucket + 1) / BUCKETS_PER_DOUBLING))


def _prompt(row: Row) -> int:
    return int(row["uncached_tokens"] + row["cache_read_tokens"] + row["cache_write_tokens"])


def _exact(row: Row) -> int:
    """1 for a request whose ceiling was counted in the replica's tokens; NULL (no ceiling,
    or recorded before kvgate kept it, or a database not yet migrated) counts as not exact."""
    return int(row["ceiling_cached_tokens"] is not None and bool(row.get("ceiling_exact")))


def _usage_delta(row: Row) -> dict[str, Any]:
    ceiling = row["ceiling_cached_tokens"]
    has_ceiling = ceiling is not None
    return {
        "requests": 1,
        **{name: row[name] for name in sums.TOKENS},
        **{name: Decimal(row[name]) for name in sums.COSTS},
        "completed_cells": 0,
        "priced_completed_cells": 0,
        "ceiling_requests": int(has_ceiling),
        "ceiling_prompt_tokens": _prompt(row) if has_ceiling else 0,
        "ceiling_cache_read_tokens": row["cache_read_tokens"] if has_ceiling else 0,
        "ceiling_cached_tokens": ceiling or 0,
        "exact_ceiling_requests": _exact(row),
        "avoidable_miss_tokens": max(ceiling - row["cache_read_tokens"], 0) if has_ceiling else 0,
    }


def _replica_delta(row: Row) -> dict[str, Any]:
    predicted, ceiling = row["predicted_cached_tokens"], row["ceiling_cached_tokens"]
    return {
        "requests": 1,
        "failed_requests": int(row["status"] != COMPLETED),
        "prompt_tokens": _prompt(row),
        "cache_read_tokens": row["cache_read_tokens"],
        "output_tokens": row["output_tokens"],
        "predicted_requests": int(predicted is not None),
        "predicted_cached_tokens": predicted or 0,
        "predicted_cache_read_tokens": row["cache_read_tokens"] if predicted is not None else 0,
        "ceiling_requests": int(ceiling is not None),
        "ceiling_prompt_tokens": _prompt(row) if ceiling is not None else 0,
        "ceiling_cache_read_tokens": row["cache_read_tokens"] if ceiling is not None else 0,
        "ceiling_cached_tokens": ceiling or 0,
        "exact_ceiling_requests": _exact(row),
        **_tier_delta(row),
    }


def _tier_delta(row: Row) -> dict[str, int]:
    """Cached tokens by tier, for rows that have the columns (a database migrated past
    0002 but not yet 0009 rebuilds without them); zero where the replica did not say."""
    if "cache_read_host_tokens" not in row:
        return {}
    host, disk = row["cache_read_host_tokens"], row["cache_read_disk_tokens"]
    reported = host is not None
    return {
        "tier_requests": int(reported),
        "tier_cache_read_tokens": row["cache_read_tokens"] if reported else 0,
        "host_cached_tokens": host or 0,
        "disk_cached_tokens": disk or 0,
    }


def _accumulate(
    into: dict[tuple[Any, ...], dict[str, Any]], key: tuple[Any, ...], delta: dict[str, Any]
) -> None:
    current = into.get(key)
    if current is None:
        into[key] = delta
    else:
        for name, value in delta.items():
            current[name] += value


Cell = tuple[str, str, str, datetime]  # (tenant, interaction, model, hour)
Columns = Mapping[str, set[str]]  # table name → the columns it has at this revision
CELLS_PER_UPDATE = 1000  # 4 parameters each: well inside SQLite's 32,766


def add(connection: Connection, rows: Sequence[Row], *, present: Columns | None = None) -> None:
    """Fold newly inserted request rows (``record_row`` dicts) into every rollup.

    ``present`` (migrations only) limits the writes to the columns the tables named there
    have then; a table it does not name has the columns the models say.
    """
    if not rows:
        return
    usage: dict[tuple[Any, ...], dict[str, Any]] = {}
    replicas: dict[tuple[Any, ...], dict[str, Any]] = {}
    ttft: dict[tuple[Any, ...], dict[str, Any]] = {}
    cells: dict[Cell, tuple[Any, ...]] = {}
    priced: dict[Cell, tuple[Any, ...]] = {}
    hours: list[datetime] = []
    for row in rows:
        hour = hour_of(row["started_at"])
        hours.append(hour)
        usage_key = (
            hour,
            row["tenant_id"],
            row["model"],
            row["price_id"] or UNPRICED,
            row["status"],
        )
        _accumulate(usage, usage_key, _usage_delta(row))
        _accumulate(replicas, (hour, row["model"], row["upstream"]), _replica_delta(row))
        if row["first_token_at"] is not None:
            bucket = ttft_bucket(row["first_token_at"] - row["started_at"])
            key = (hour, row["tenant_id"], row["model"], row["cache_read_tokens"] > 0, bucket)
            _accumulate(ttft, key, {"requests": 1})
        if row["status"] == COMPLETED:
            cell = (row["tenant_id"], row["interaction_id"], row["model"], hour)
            cells.setdefault(cell, usage_key)
            if row["price_id"] is not None:
                priced.setdefault(cell, usage_key)
    cell_columns = None if present is None else present.get(InteractionCellRow.__tablename__)
    new_cells, newly_priced = _new_cells(connection, cells, priced, cell_columns)
    for cell in new_cells:
        usage[cells[cell]]["completed_cells"] += 1
    for cell in newly_priced:
        usage[priced[cell]]["priced_completed_cells"] += 1
    for table, deltas in (
        (UsageHourRow.__table__, usage),
        (ReplicaHourRow.__table__, replicas),
        (TtftHourRow.__table__, ttft),
    ):
        columns = None if present is None else present.get(table.name)  # type: ignore[attr-defined]
        _upsert(connection, table, deltas, columns)  # type: ignore[arg-type]
    for rollup, keys, summed, deltas_of in (
        (breaks.TABLE, breaks.KEYS, breaks.SUMMED, breaks.deltas),
        (deployments.TABLE, deployments.KEYS, deployments.SUMMED, deployments.deltas),
    ):
        if present is None or rollup.name in present:  # not there yet: a migration's rebuild
            bulk.add_deltas(connection, rollup, deltas_of(rows, hours), keys=keys, summed=summed)
    if present is None or lines.LINES.name in present:
        lines.add(connection, rows, [hour.date() for hour in hours])


def _new_cells(
    connection: Connection,
    cells: Mapping[Cell, Any],
    priced: Mapping[Cell, Any],
    columns: set[str] | None,
) -> tuple[list[Cell], list[Cell]]:
    """Insert the cells and flag interactions now in several; return the cells that were
    new, and the cells a priced attempt completed for the first time."""
    if not cells:
        return [], []
    table: Table = InteractionCellRow.__table__  # type: ignore[assignment]
    keeps_priced = columns is None or "priced" in columns
    params = [
        {
            "tenant_id": t,
            "interaction_id": i,
            "model": m,
            "hour": h,
            "spans": False,
            **({"priced": (t, i, m, h) in priced} if keeps_priced else {}),
        }
        for t, i, m, h in sorted(cells)
    ]
    created = bulk.insert_rows(
        connection,
        table,
        params,
        conflict=None,
        returning=["tenant_id", "interaction_id", "model", "hour"],
    )
    new = [(t, i, m, hour_of(h)) for t, i, m, h in created]
    newly_priced = [cell for cell in new if cell in priced] if keeps_priced else []
    if keeps_priced:
        newly_priced += _price_cells(connection, table, sorted(set(priced) - set(new)))
    _flag_spans(connection, table, new)
    return new, newly_priced


def _price_cells(connection: Connection, table: Table, cells: Sequence[Cell]) -> list[Cell]:
    """Mark existing cells priced; return those that were not yet (a priced attempt
    completing an interaction an unpriced one had already completed in that cell)."""
    key = tuple_(table.c.tenant_id, table.c.interaction_id, table.c.model, table.c.hour)
    priced: list[Cell] = []
    for start in range(0, len(cells), CELLS_PER_UPDATE):
        # Of two writers pricing one cell at once the second waits for the first's row
        # lock, then finds it priced: a cell is counted priced once.
        result = connection.execute(
            update(table)
            .where(key.in_(cells[start : start + CELLS_PER_UPDATE]), table.c.priced.is_(False))
            .values(priced=True)
            .returning(table.c.tenant_id, table.c.interaction_id, table.c.model, table.c.hour)
            .execution_options(synchronize_session=False)
        )
        priced += [(t, i, m, hour_of(h)) for t, i, m, h in result]
    return priced


def _flag_spans(connection: Connection, table: Table, new: Sequence[Cell]) -> None:
    """Count the new cells per interaction; flag every cell of interactions now in several."""
    per_interaction: dict[tuple[str, str], int] = defaultdict(int)
    for tenant, interaction, _model, _hour in new:
        per_interaction[(tenant, interaction)] += 1
    if not per_interaction:
        return
    # The upsert takes the interaction's row lock, so of two writers adding cells to one
    # interaction at once the second sees the first's count: "spans" is never missed.
    counts = bulk.insert_rows(
        connection,
        InteractionRow.__table__,  # type: ignore[arg-type]
        [
            {"tenant_id": t, "interaction_id": i, "cells": n}
            for (t, i), n in sorted(per_interaction.items())
        ],
        conflict=["tenant_id", "interaction_id"],
        add=["cells"],
        returning=["tenant_id", "interaction_id", "cells"],
    )
    spanning = [{"t": t, "i": i} for t, i, n in counts if n > 1]
    if spanning:
        connection.execute(
            update(table)
            .where(
                table.c.tenant_id == bindparam("t"),
                table.c.interaction_id == bindparam("i"),
                table.c.spans.is_(False),
            )
            .values(spans=True)
            .execution_options(synchronize_session=False),
            sorted(spanning, key=lambda p: (p["t"], p["i"])),
        )


def _upsert(
    connection: Connection,
    table: Table,
    deltas: Mapping[tuple[Any, ...], Mapping[str, Any]],
    columns: set[str] | None = None,
) -> None:
    """Add the deltas to their rows, creating rows that do not exist yet."""
    if not deltas:
        return
    keys = [column.name for column in table.primary_key.columns]
    # Sorted keys: concurrent writers lock rows in one order and cannot deadlock.
    rows = [
        {**dict(zip(keys, key, strict=True)), **values} for key, values in sorted(deltas.items())
    ]
    if columns is not None:
        rows = [{name: value for name, value in row.items() if name in columns} for row in rows]
    bulk.insert_rows(
        connection, table, rows, conflict=keys, add=[name for name in rows[0] if name not in keys]
    )


def rebuild(connection: Connection, batch_size: int = 5000) -> int:
    """Recompute every rollup from the requests table; returns the requests folded in.

    Migrations call this at their own revision, so it reads and writes only the columns
    the tables have then (a request column added later reads as 0); each migration that
    adds a rollup column rebuilds again.
    """
    inspector = inspect(connection)
    present = {
        name: {column["name"] for column in inspector.get_columns(name)}
        for name in (
            RequestRow.__tablename__,
            UsageHourRow.__tablename__,
            ReplicaHourRow.__tablename__,
            TtftHourRow.__tablename__,
            InteractionCellRow.__tablename__,
            BreakHourRow.__tablename__,
            DeploymentHourRow.__tablename__,
            StatementLineRow.__tablename__,
            StatementCellRow.__tablename__,
        )
        # break_hours: from 0010 on; deployment_hours: 0016; statement_lines: 0019
        if inspector.has_table(name)
    }
    for model in (UsageHourRow, ReplicaHourRow, TtftHourRow, InteractionCellRow, InteractionRow):
        connection.execute(model.__table__.delete())  # type: ignore[attr-defined]
    for later in (BreakHourRow, DeploymentHourRow, StatementCellRow, StatementLineRow):
        if later.__tablename__ in present:
            connection.execute(later.__table__.delete())  # type: ignore[attr-defined]
    requests = RequestRow.__table__
    order = (requests.c.started_at, requests.c.request_id)
    stored = present[RequestRow.__tablename__]
    columns = [
        requests.c[name]
        if name in stored
        # A break column not there yet is no break (NULL), not a break at offset 0; an
        # endpoint not kept yet (before 0013) is none; so are a rate set and a usage source
        # (read by statement lines alone, which come later than both).
        else (
            null()
            if name in (*breaks.COLUMNS, "endpoint", "rate_class", "usage_source")
            else literal(0, Integer)
        ).label(name)
        for name in READ_COLUMNS
    ]
    # Tier columns are read only where they exist: absent, a request has no tier report
    # (NULL), which a 0 would not say.
    columns += [requests.c[name] for name in TIER_COLUMNS if name in stored]
    folded, after = 0, None
    while True:
        # Keyset pages: no cursor stays open while the same connection writes.
        query = select(*columns).order_by(*order).limit(batch_size)
        if after is not None:
            query = query.where(tuple_(*order) > tuple_(*after))
        batch = connection.execute(query).mappings().all()
        if not batch:
            return folded
        add(connection, cast(Sequence[Row], batch), present=present)
        folded += len(batch)
        after = (batch[-1]["started_at"], batch[-1]["request_id"])
