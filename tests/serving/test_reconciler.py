"""The gateway's reconciliation checks: each window once, one window after it closed; a
drift over 1 % is a log line, a count and a gauge (gateway.serving.reconciler)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest

from gateway.accounting.store import insert_records
from gateway.db.session import make_engine, session_factory
from gateway.db.writer.samples import insert_samples
from gateway.metrics import Metrics
from gateway.serving.reconciler import Reconciler, window_floor
from gateway.usage import Usage
from tests.factories import record


def at(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 7, 1, 10, minute, second, tzinfo=UTC)


def reading(clock: datetime, prompt: int) -> dict[str, object]:
    return {
        "upstream": "http://r1",
        "sampler": "s",
        "sampled_at": clock,
        "prefix_cache_queries": prompt,
        "prefix_cache_hits": 0,
        "prompt_tokens": prompt,
        "generation_tokens": 0,
    }


def test_windows_are_floored_from_the_epoch() -> None:
    assert window_floor(at(7, 30), timedelta(minutes=5)) == at(5)
    assert window_floor(at(7, 30), timedelta(hours=1)) == at(0)


def test_each_window_is_checked_once_a_window_after_it_closed_and_drift_is_said(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(database_url)
    insert_samples(engine, [reading(at(0, 1), 0), reading(at(0, 59), 1000)])
    # kvgate recorded 990 of the 1,000 prompt tokens the replica counted: 1 %, not over.
    insert_records(
        engine, [record("a", started_at=at(0, 30), upstream="http://r1", usage=Usage(990, 0, 0, 1))]
    )
    insert_samples(engine, [reading(at(1, 59), 1500)])  # then 500 that kvgate never saw
    now = [at(0, 30)]
    metrics = Metrics()
    reconciler = Reconciler(
        engine=engine,
        sessions=session_factory(engine),
        http=None,  # type: ignore[arg-type]  # no sampling here
        urls=["http://r1"],
        metrics=metrics,
        window_s=60,
        keep_days=1,
        clock=lambda: now[0],
    )
    now[0] = at(1, 59)
    assert asyncio.run(reconciler.check_due()) == []  # [10:00, 10:01) closed, not yet due
    now[0] = at(2, 0)
    [first] = asyncio.run(reconciler.check_due())
    assert (first.start, first.recorded.prompt_tokens, first.engine.prompt_tokens) == (
        at(0),
        990,
        1000,
    )
    assert first.over() == []
    assert asyncio.run(reconciler.check_due()) == []  # once
    with caplog.at_level(logging.WARNING, logger="kvgate.reconcile"):
        now[0] = at(3, 0)
        [second] = asyncio.run(reconciler.check_due())
    assert (second.recorded.prompt_tokens, second.engine.prompt_tokens) == (0, 500)
    assert caplog.messages == [
        "replica http://r1: prompt tokens 2026-07-01T10:00:59Z..2026-07-01T10:01:59Z: "
        "kvgate recorded 0, the replica counted 500 (-100.00%)"
    ]
    text = metrics.exposition().decode()
    assert 'kvgate_replica_drift_windows_total{replica="http://r1",tokens="prompt"} 1.0' in text
    assert 'kvgate_replica_drift_ratio{replica="http://r1",tokens="prompt"} -1.0' in text
    engine.dispose()
