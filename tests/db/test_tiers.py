"""Cached tokens by cache tier: a record's tiers survive the journal and the database, sum
into the replica rollups exactly (a rebuild gives the same), and the tier figure shows
only replicas that reported tiers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.accounting.records import Record
from gateway.accounting.store import insert_records
from gateway.db.figures import tiers
from gateway.db.figures.spend import Scope
from gateway.db.models import ReplicaHourRow, RequestRow
from gateway.db.session import make_engine
from gateway.db.writer import rollups
from gateway.usage import Usage
from tests.factories import record

EVERYTHING = Scope(datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
TIERED = "http://127.0.0.1:1"
GPU_ONLY = "http://127.0.0.1:2"


def make_record(request_id: str, **fields: Any) -> Record:
    """A priced attempt, served by the tiered replica unless it says otherwise."""
    return record(request_id, **{"upstream": TIERED, **fields})


def records() -> list[Record]:
    """Two requests from a replica that says its tiers, one from one that does not."""
    return [
        make_record("req_1", cache_read_host_tokens=512, cache_read_disk_tokens=0),
        make_record(
            "req_2",
            usage=Usage(100, 2048, 0, 10),
            cache_read_host_tokens=1024,
            cache_read_disk_tokens=512,
        ),
        make_record("req_3", upstream=GPU_ONLY),
    ]


def test_a_records_tiers_round_trip_through_its_journal_line() -> None:
    record = records()[1]
    again = Record.from_json(record.to_json())
    assert (again.cache_read_host_tokens, again.cache_read_disk_tokens) == (1024, 512)
    # A journal line written before tiers were kept reads as "not reported".
    old = record.to_json().replace(b',"cache_read_host_tokens":1024', b"")
    old = old.replace(b',"cache_read_disk_tokens":512', b"")
    assert Record.from_json(old).cache_read_host_tokens is None


def test_tiers_are_stored_summed_per_replica_hour_and_shown_per_replica(
    database_url: str,
) -> None:
    engine = make_engine(database_url)
    try:
        insert_records(engine, records())
        with engine.connect() as connection:
            stored = {
                row.request_id: (row.cache_read_host_tokens, row.cache_read_disk_tokens)
                for row in connection.execute(select(RequestRow))
            }
            summed = {
                row.upstream: (
                    row.tier_requests,
                    row.tier_cache_read_tokens,
                    row.host_cached_tokens,
                    row.disk_cached_tokens,
                )
                for row in connection.execute(select(ReplicaHourRow))
            }
        assert stored == {"req_1": (512, 0), "req_2": (1024, 512), "req_3": (None, None)}
        assert summed == {TIERED: (2, 3072, 1536, 512), GPU_ONLY: (0, 0, 0, 0)}
        with engine.begin() as connection:
            rollups.rebuild(connection)
            rebuilt = connection.execute(
                select(ReplicaHourRow.tier_requests, ReplicaHourRow.host_cached_tokens).where(
                    ReplicaHourRow.upstream == TIERED
                )
            ).one()
        assert tuple(rebuilt) == (2, 1536)
        with Session(engine) as session:
            figures = tiers.by_replica(session, EVERYTHING)
        assert [(f.upstream, f.requests) for f in figures] == [(TIERED, 2)]
        (figure,) = figures
        assert (figure.gpu_tokens, figure.host_tokens, figure.disk_tokens) == (1024, 1536, 512)
        assert str(figure.share(figure.host_tokens)) == "0.5"
    finally:
        engine.dispose()
