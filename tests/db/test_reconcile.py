"""Reconciliation against the engine, in SQL: samples of the replicas' counters against the
records of the attempts placed there, per replica and window (gateway.db.figures.reconcile).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import Engine

from gateway.accounting.store import insert_records
from gateway.db.figures.reconcile import Counted, Recorded, reconcile
from gateway.db.session import make_engine, session_factory
from gateway.db.writer.samples import insert_samples, prune_samples
from gateway.usage import Usage
from tests.factories import record


def at(clock: str) -> datetime:
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return datetime(2026, 7, 1, hours, minutes, seconds, tzinfo=UTC)


def sample(
    upstream: str, sampler: str, clock: str, queries: int, hits: int, prompt: int, out: int
) -> dict[str, object]:
    return {
        "upstream": upstream,
        "sampler": sampler,
        "sampled_at": at(clock),
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prompt_tokens": prompt,
        "generation_tokens": out,
    }


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


def attempt(name: str, clock: str, upstream: str, prompt: int, cached: int) -> object:
    return record(
        name,
        started_at=at(clock),
        upstream=upstream,
        usage=Usage(uncached_tokens=prompt - cached, cache_read_tokens=cached, output_tokens=5),
    )


def test_windows_are_the_spans_between_samples_and_records_fall_in_them_by_start(
    engine: Engine,
) -> None:
    insert_samples(
        engine,
        [
            sample("http://r1", "a", "09:59:30", 1000, 400, 1000, 50),
            sample("http://r1", "a", "10:20:00", 1300, 500, 1300, 60),
            sample("http://r1", "a", "10:59:40", 1600, 700, 1600, 70),
            # The replica restarted after 11:10: its counters start from zero again.
            sample("http://r1", "a", "11:40:00", 900, 300, 900, 20),
            # Another worker's samples cover less of the first window: not chosen.
            sample("http://r1", "b", "10:30:00", 1400, 600, 1400, 65),
            sample("http://r1", "b", "10:45:00", 1500, 650, 1500, 68),
            sample("http://r2", "a", "10:10:00", 0, 0, 0, 0),
            sample("http://r2", "a", "10:50:00", 250, 100, 250, 10),
        ],
    )
    insert_records(
        engine,
        [
            attempt("early", "09:59:00", "http://r1", 999, 999),  # before the first sample
            attempt("w1a", "10:05:00", "http://r1", 350, 200),
            attempt("w1b", "10:30:00", "http://r1", 250, 100),
            attempt("w2a", "10:59:50", "http://r1", 100, 0),  # after the window's last sample
            attempt("w2b", "11:10:00", "http://r1", 400, 100),
            attempt("w2c", "11:35:00", "http://r1", 500, 200),
            attempt("r2a", "10:20:00", "http://r2", 250, 100),
            attempt("r2b", "10:55:00", "http://r2", 77, 0),  # after r2's last sample
        ],
    )
    with session_factory(engine)() as session:
        found = reconcile(session, since=at("10:00:00"), until=at("12:00:00"))
    summary = [
        (
            w.upstream,
            w.start,
            w.sampled_from,
            w.sampled_to,
            w.sampler,
            w.restarted,
            w.engine,
            w.recorded,
        )
        for w in found
    ]
    assert summary == [
        (
            "http://r1",
            at("10:00:00"),
            at("09:59:30"),
            at("10:59:40"),
            "a",
            False,
            Counted(600, 300, 600, 20),
            Recorded(2, 600, 300, 10),
        ),
        (
            "http://r1",
            at("11:00:00"),
            at("10:59:40"),
            at("11:40:00"),
            "a",
            True,  # from zero at the restart: what it counted before it is lost
            Counted(900, 300, 900, 20),
            Recorded(3, 1000, 300, 15),
        ),
        (
            "http://r2",
            at("10:00:00"),
            at("10:10:00"),  # no sample before the window: it starts at its first
            at("10:50:00"),
            "a",
            False,
            Counted(250, 100, 250, 10),
            Recorded(1, 250, 100, 5),
        ),
    ]
    first, second, third = found
    assert (first.prompt_drift, first.cached_drift, first.over()) == (0, 0, [])
    assert second.prompt_drift == Decimal(100) / 900
    assert second.cached_drift == 0
    assert second.over() == ["prompt"]
    assert third.over() == []


def test_a_window_inside_one_hour_and_one_across_hours_count_the_same_records(
    engine: Engine,
) -> None:
    insert_samples(
        engine,
        [
            sample("http://r1", "a", "10:40:00", 0, 0, 0, 0),
            sample("http://r1", "a", "10:50:00", 100, 10, 100, 1),
            sample("http://r1", "a", "12:10:00", 600, 60, 600, 6),
        ],
    )
    insert_records(
        engine,
        [
            attempt("a", "10:45:00", "http://r1", 100, 10),
            attempt("b", "11:15:00", "http://r1", 200, 20),
            attempt("c", "12:05:00", "http://r1", 300, 30),
            attempt("d", "12:15:00", "http://r1", 400, 40),  # after the last sample
        ],
    )
    with session_factory(engine)() as session:
        short = reconcile(
            session, since=at("10:40:00"), until=at("10:55:00"), window=timedelta(minutes=15)
        )
        wide = reconcile(
            session, since=at("10:40:00"), until=at("12:40:00"), window=timedelta(hours=3)
        )
    assert [(w.recorded, w.engine.prompt_tokens) for w in short] == [(Recorded(1, 100, 10, 5), 100)]
    assert [(w.recorded, w.engine.prompt_tokens) for w in wide] == [(Recorded(3, 600, 60, 15), 600)]


def test_old_samples_are_pruned(engine: Engine) -> None:
    insert_samples(
        engine,
        [
            sample("http://r1", "a", "10:00:00", 0, 0, 0, 0),
            sample("http://r1", "a", "11:00:00", 1, 1, 1, 1),
        ],
    )
    assert prune_samples(engine, before=at("10:30:00")) == 1
    # The same reading stored twice is kept once.
    assert insert_samples(engine, [sample("http://r1", "a", "11:00:00", 1, 1, 1, 1)]) == 0
