"""The database writer's CPU per record on Postgres: the batch insert of request rows, and
a whole batch as the writer makes it (rows and every rollup).

The writer runs on the gateway's host, in the benchmarks on the serving core: each
microsecond it spends on a record is one the gateway does not serve with. Measured with
``time.process_time`` (this process's CPU only; Postgres's own work is not in it), median
of the batches, on a scratch database of the given server. The baseline, measured in the
same run, is the form the writer used before (one array per column under ``unnest``,
dumped by psycopg element by element).

    .venv/bin/python benchmarks/writer.py [--batches 40] [--batch 64]
        [--database-url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Connection, Table
from sqlalchemy.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import scratch_database
from gateway.accounting.records import Record
from gateway.accounting.store import insert_records, record_row
from gateway.db.migrate import upgrade
from gateway.db.models import RequestRow
from gateway.db.session import make_engine
from gateway.db.writer import bulk
from gateway.usage import Usage
from tests.factories import record

REQUESTS: Table = RequestRow.__table__  # type: ignore[assignment]


def records(size: int) -> list[Record]:
    """A batch of priced, completed chat records with tags, as the gateway journals them."""
    batch = secrets.token_hex(4)
    return [
        record(
            f"req_{batch}_{n}",
            usage=Usage(24, 96, 0, 3),
            upstream="http://127.0.0.1:8001",
            tags={"team": "search"},
            predicted_cached_tokens=96,
        )
        for n in range(size)
    ]


def unnest_insert(connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """The baseline: the request rows as one array per column under ``unnest``."""
    dialect = connection.dialect
    names = tuple(rows[0])
    columns = [REQUESTS.c[name] for name in names]
    arrays = ", ".join(f"%s::{c.type.compile(dialect=dialect)}[]" for c in columns)
    sql = (
        f"INSERT INTO requests ({', '.join(names)}) SELECT * FROM unnest({arrays})"
        " ON CONFLICT (request_id) DO NOTHING RETURNING request_id"
    )
    processors = [
        (lambda v: None if v is None else orjson.dumps(v).decode())
        if name == "tags"
        else c.type.bind_processor(dialect)
        for name, c in zip(names, columns, strict=True)
    ]
    values = tuple(
        [row[name] for row in rows] if process is None else [process(row[name]) for row in rows]
        for name, process in zip(names, processors, strict=True)
    )
    list(connection.exec_driver_sql(sql, values))


def current_insert(connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """The writer's own batch insert of request rows."""
    bulk.insert_rows(connection, REQUESTS, rows, conflict=["request_id"], returning=["request_id"])


def per_row(
    engine: Engine, insert: Callable[[Connection, Sequence[Mapping[str, Any]]], None], args: Any
) -> float:
    """Median CPU microseconds per row of one way of inserting request rows."""
    times = []
    for _ in range(args.batches):
        rows = [record_row(r) for r in records(args.batch)]
        with engine.begin() as connection:
            started = time.process_time()
            insert(connection, rows)
            times.append(time.process_time() - started)
    return statistics.median(times) * 1e6 / args.batch


def per_record(engine: Engine, args: Any) -> float:
    """Median CPU microseconds per record of a whole batch: rows and rollups."""
    times = []
    for _ in range(args.batches):
        batch = records(args.batch)
        started = time.process_time()
        insert_records(engine, batch)
        times.append(time.process_time() - started)
    return statistics.median(times) * 1e6 / args.batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=40, help="batches timed per way")
    parser.add_argument("--batch", type=int, default=64, help="records per batch")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    with scratch_database(args.database_url, "kvgate_writer_") as url:
        upgrade(url)
        engine = make_engine(url)
        for round_ in (1, 2):  # alternated, so that a drift of the machine shows
            baseline = per_row(engine, unnest_insert, args)
            now = per_row(engine, current_insert, args)
            print(
                f"round {round_}: request rows, CPU per row: unnest arrays {baseline:.1f} µs,"
                f" JSON recordset {now:.1f} µs ({baseline / now:.1f}x less)"
            )
        print(
            f"a whole batch (rows and rollups), CPU per record: {per_record(engine, args):.1f} µs"
        )
        engine.dispose()


if __name__ == "__main__":
    main()
