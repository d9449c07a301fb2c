"""Batch inserts that skip rows already there, returning the rows they created.

On Postgres a batch is one short statement over ``unnest`` of one array per column:

    INSERT INTO requests (request_id, …) SELECT * FROM unnest(%s::VARCHAR(64)[], …)
    ON CONFLICT (request_id) DO NOTHING RETURNING request_id

SQLAlchemy's own batch form (``insertmanyvalues``) writes one ``VALUES`` group per row into
one long statement, which psycopg then parses for its placeholders on every batch: for
the requests table that parse was most of the writer's CPU (benchmarks/README.md). With
arrays the statement is the same for every batch,
its text is parsed once, and the values travel as arrays in binary form.

Other databases (SQLite, the embedded default) take SQLAlchemy's form, which is cheap
there: the driver binds ``?`` placeholders without parsing them in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import orjson
from sqlalchemy import JSON, Connection, Table
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
        sql, processors = _unnest_insert(
            connection.dialect,
            table,
            names,
            tuple(conflict) if conflict is not None else None,
            tuple(add),
            tuple(returning),
        )
        arrays = tuple(
            [row[name] for row in rows] if process is None else [process(row[name]) for row in rows]
            for name, process in zip(names, processors, strict=True)
        )
        result = connection.exec_driver_sql(sql, arrays)
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


Processor = Callable[[Any], Any] | None


@lru_cache(maxsize=64)
def _unnest_insert(
    dialect: Dialect,
    table: Table,
    names: tuple[str, ...],
    conflict: tuple[str, ...] | None,
    add: tuple[str, ...],
    returning: tuple[str, ...],
) -> tuple[str, tuple[Processor, ...]]:
    """The statement's text, and each column's bind processing (the column types' own:
    money quantized, datetimes in UTC), both made once per table and column set."""
    quote = dialect.identifier_preparer.quote
    name = dialect.identifier_preparer.format_table(table)
    columns = [table.c[column] for column in names]
    arrays = ", ".join(f"%s::{column.type.compile(dialect=dialect)}[]" for column in columns)
    target = f" ({', '.join(quote(column) for column in conflict)})" if conflict else ""
    action = (
        "DO UPDATE SET "
        + ", ".join(f"{quote(c)} = {name}.{quote(c)} + EXCLUDED.{quote(c)}" for c in add)
        if add
        else "DO NOTHING"
    )
    sql = (
        f"INSERT INTO {name} ({', '.join(quote(column) for column in names)})"
        f" SELECT * FROM unnest({arrays}) ON CONFLICT{target} {action}"
    )
    if returning:
        sql += f" RETURNING {', '.join(quote(column) for column in returning)}"
    return sql, tuple(_processor(column.type, dialect) for column in columns)


def _json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _processor(type_: Any, dialect: Dialect) -> Processor:
    """A column type's bind processing for an array element. JSON goes as its text (cast
    by ``::JSON[]``): psycopg adapts a dict only as a whole parameter, not in an array."""
    if isinstance(type_, JSON):
        return _json_text
    processor: Processor = type_.bind_processor(dialect)
    return processor
