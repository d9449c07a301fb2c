"""Batch inserts that skip rows already there, returning the rows they created.

On Postgres a batch is one short statement over one JSON document of its rows:

    INSERT INTO requests (request_id, …)
    SELECT request_id, … FROM json_populate_recordset(NULL::requests, %s::json)
    ON CONFLICT (request_id) DO NOTHING RETURNING request_id

The document is made by orjson in C, and Postgres reads each value with its column's own
input function, so the writer spends about 10 µs of CPU a request row instead of the
80–90 µs that psycopg's array dumper (Python, element by element, for one array per
column under ``unnest``) took (benchmarks/README.md, "The writer's CPU a record"). The
statement's text is the same for every batch, and rows keep their order: the rollups
rely on it to lock their rows in one order.

SQLAlchemy's own batch form (``insertmanyvalues``) writes one ``VALUES`` group per row into
one long statement, which psycopg then parses for its placeholders on every batch. Other
databases (SQLite, the embedded default) take that form, which is cheap there: the driver
binds ``?`` placeholders without parsing them in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from functools import lru_cache, partial
from typing import Any

import orjson
from sqlalchemy import JSON, Boolean, Connection, Table, TypeDecorator
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect


def insert_rows(
    connection: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    conflict: Sequence[str] | None,
    add: Sequence[str] = (),
    returning: Sequence[str] = (),
) -> list[tuple[Any, ...]]:
    """Insert ``rows`` (dicts with the same keys). A row that conflicts on ``conflict``
    (any unique constraint when None) is left alone, or, with ``add``, has those columns
    increased by the new row's values. Returns the ``returning`` columns of the rows this
    statement created or increased."""
    if not rows:
        return []
    names = tuple(rows[0])
    if connection.dialect.name == "postgresql":
        sql, processed = _recordset_insert(
            connection.dialect,
            table,
            names,
            tuple(conflict) if conflict is not None else None,
            tuple(add),
            tuple(returning),
        )
        if processed:
            rows = [_processed(row, processed) for row in rows]
        document = orjson.dumps(rows, default=_decimal_text).decode()
        result = connection.exec_driver_sql(sql, (document,))
        return [tuple(r) for r in result] if returning else []
    insert = sqlite.insert(table)
    if add:
        statement = insert.on_conflict_do_update(
            index_elements=list(conflict or ()),
            set_={name: table.c[name] + insert.excluded[name] for name in add},
        )
    elif conflict is not None:
        statement = insert.on_conflict_do_nothing(index_elements=list(conflict))
    else:
        statement = insert.on_conflict_do_nothing()
    if not returning:
        connection.execute(statement, list(rows))
        return []
    result = connection.execute(
        statement.returning(*(table.c[name] for name in returning)), list(rows)
    )
    return [tuple(r) for r in result]


# What a batch of requests adds to a rollup: the summed values under each row's key values.
Deltas = dict[tuple[Any, ...], list[Any]]


def add_deltas(
    connection: Connection,
    table: Table,
    deltas: Deltas,
    *,
    keys: Sequence[str],
    summed: Sequence[str],
) -> None:
    """Add each delta (``summed`` values under its ``keys`` values) to its row of a rollup,
    creating the rows that do not exist yet."""
    if not deltas:
        return
    # Sorted keys: concurrent writers lock rows in one order and cannot deadlock.
    insert_rows(
        connection,
        table,
        [
            {**dict(zip(keys, key, strict=True)), **dict(zip(summed, values, strict=True))}
            for key, values in sorted(deltas.items())
        ],
        conflict=keys,
        add=summed,
    )


Processor = Callable[[Any], Any]


def _processed(
    row: Mapping[str, Any], processed: tuple[tuple[str, Processor], ...]
) -> dict[str, Any]:
    """The row with the columns whose type processes its values (money quantized,
    datetimes in UTC) processed."""
    out = dict(row)
    for name, process in processed:
        value = out[name]
        if value is not None:
            out[name] = process(value)
    return out


def _decimal_text(value: Any) -> str:
    """orjson's fallback: a Decimal as its exact text (Postgres's numeric reads it so)."""
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not a column value")


def _decorated(process: Callable[[Any, Dialect], Any], dialect: Dialect, value: Any) -> Any:
    return process(value, dialect)


@lru_cache(maxsize=64)
def _recordset_insert(
    dialect: Dialect,
    table: Table,
    names: tuple[str, ...],
    conflict: tuple[str, ...] | None,
    add: tuple[str, ...],
    returning: tuple[str, ...],
) -> tuple[str, tuple[tuple[str, Processor], ...]]:
    """The statement's text, and the columns whose values the type processes (with its
    processing), both made once per table and column set."""
    quote = dialect.identifier_preparer.quote
    name = dialect.identifier_preparer.format_table(table)
    columns = ", ".join(quote(column) for column in names)
    target = f" ({', '.join(quote(column) for column in conflict)})" if conflict else ""
    action = (
        "DO UPDATE SET "
        + ", ".join(f"{quote(c)} = {name}.{quote(c)} + EXCLUDED.{quote(c)}" for c in add)
        if add
        else "DO NOTHING"
    )
    sql = (
        f"INSERT INTO {name} ({columns}) SELECT {columns}"
        f" FROM json_populate_recordset(NULL::{name}, %s::json) ON CONFLICT{target} {action}"
    )
    if returning:
        sql += f" RETURNING {', '.join(quote(column) for column in returning)}"
    processed: list[tuple[str, Processor]] = []
    for column in names:
        type_ = table.c[column].type
        # JSON values go inside the document as they are, and booleans as JSON booleans.
        if isinstance(type_, (JSON, Boolean)):
            continue
        if isinstance(type_, TypeDecorator):
            # Its own step alone: the impl's processing after it is none on psycopg.
            assert dialect.type_descriptor(type_.impl_instance).bind_processor(dialect) is None
            processed.append((column, partial(_decorated, type_.process_bind_param, dialect)))
        elif (process := type_.bind_processor(dialect)) is not None:
            processed.append((column, process))
    return sql, tuple(processed)
