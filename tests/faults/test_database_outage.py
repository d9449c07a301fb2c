"""Postgres stopped for 30 s under steady load: the gateway keeps serving, records wait in
the journal, and they drain when the database returns, each exactly once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.conftest import MODEL, make_stack
from tests.faults.load import Load
from tests.faults.postgres import PrivatePostgres
from tests.faults.probes import completed_ids, healthz, metric, rollup_requests
from tests.support.processes import wait_recorded

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
OUTAGE_S = 30.0
RATE = 100.0  # requests/s, half of them streams


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    server.start()
    yield server
    server.destroy()


def test_postgres_outage_under_load_loses_and_duplicates_nothing(
    postgres: PrivatePostgres, tmp_path: Path
) -> None:
    stack = make_stack(tmp_path, postgres.url)
    try:
        load = Load(stack.url, stack.key, MODEL, rate=RATE).start()
        time.sleep(3)
        assert metric(stack.url, "kvgate_database_up") == 1.0

        postgres.stop()
        down_at = time.monotonic()
        backlog: list[float] = []
        database_up: list[float] = []
        while time.monotonic() - down_at < OUTAGE_S:
            time.sleep(1)
            backlog.append(metric(stack.url, "kvgate_recorder_backlog"))
            database_up.append(metric(stack.url, "kvgate_database_up"))
        up_at = time.monotonic()
        postgres.start()
        # Drained while the load goes on: the backlog is back to what one flush holds.
        while healthz(stack.url)["recorder_backlog"] > RATE / 2:  # type: ignore[operator]
            assert time.monotonic() - up_at < 60, "the backlog did not drain"
            time.sleep(0.2)
        drained_in = time.monotonic() - up_at
        time.sleep(2)
        tally = load.stop()
        wait_recorded(stack.url, timeout_s=60)

        served_during = tally.completed_between(down_at, up_at)
        print(
            f"outage {OUTAGE_S:.0f} s at {RATE:.0f}/s: served {served_during} during it, "
            f"{len(tally.completed)} in all ({tally.streams} streams); backlog peak "
            f"{max(backlog):.0f}; drained {drained_in:.1f} s after restart; "
            f"latency max {max(tally.latencies) * 1000:.0f} ms"
        )
        # The clients never noticed.
        assert tally.errors == []
        assert set(tally.statuses) == {200}
        assert served_during >= 0.8 * RATE * OUTAGE_S
        # The metrics showed the outage: the database down, the backlog growing.
        assert database_up[-1] == 0.0 and min(database_up) == 0.0
        assert backlog[-1] >= served_during * 0.9
        assert backlog == sorted(backlog)  # nothing left the journal while it was down
        # And recovery: drained, database up, every request the clients saw recorded once.
        assert healthz(stack.url)["recorder_backlog"] == 0
        assert metric(stack.url, "kvgate_database_up") == 1.0
        recorded = completed_ids(stack.engine)
        assert len(recorded) == len(tally.completed) == len(set(tally.completed))
        assert sorted(recorded) == sorted(tally.completed)
        assert rollup_requests(stack.engine) == len(tally.completed)
    finally:
        stack.close()
