"""SIGKILL the gateway again and again under load: after each restart, every request a
client saw complete has exactly one record, and the rollups count each once.

Kills alternate between the gateway alone (its database writer is told and drains) and
its whole process group (a machine crash, as far as the journal can tell: the restarted
gateway replays it), with the journal on default settings (``background`` sync).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import new_database
from tests.faults.conftest import MODEL, make_stack
from tests.faults.load import Load
from tests.faults.probes import completed_ids, rollup_requests
from tests.support.processes import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres]
CYCLES = 6
RATE = 100.0
CONCURRENCY = 16


def test_repeated_sigkill_under_load_keeps_exactly_one_record_per_completed_request(
    tmp_path: Path,
) -> None:
    rng = random.Random(9)
    with new_database("postgres", tmp_path) as database_url:
        stack = make_stack(tmp_path, database_url, start=False)
        port = free_port()
        seen: list[str] = []
        report = []
        try:
            for cycle in range(CYCLES):
                gateway = stack.start_gateway(port=port)
                # The previous cycle's requests: all recorded once the restarted gateway
                # has replayed (or the old writer drained) the journal.
                deadline = time.monotonic() + 60
                while not set(seen) <= set(recorded := completed_ids(stack.engine)):
                    assert time.monotonic() < deadline, f"cycle {cycle}: records lost"
                    time.sleep(0.2)
                assert len(set(recorded)) == len(recorded)
                load = Load(stack.url, stack.key, MODEL, rate=RATE, concurrency=CONCURRENCY)
                load.start()
                time.sleep(rng.uniform(2.0, 4.0))
                whole_group = cycle % 2 == 1
                if whole_group:
                    os.killpg(gateway.process.pid, signal.SIGKILL)
                    gateway.process.wait()
                else:
                    gateway.stop(signal.SIGKILL)
                tally = load.stop()
                assert gateway.process.returncode == -signal.SIGKILL
                assert set(tally.statuses) <= {200}
                seen += tally.completed
                report.append((len(tally.completed), len(tally.errors), whole_group))

            stack.start_gateway(port=port)
            deadline = time.monotonic() + 60
            while not set(seen) <= set(recorded := completed_ids(stack.engine)):
                assert time.monotonic() < deadline, "records lost after the last kill"
                time.sleep(0.2)
            stack.gateway.stop()  # type: ignore[union-attr]  # a clean stop drains the rest
            recorded = completed_ids(stack.engine)
            extra = len(recorded) - len(seen)
            print(
                "cycles (completed, client errors once killed, whole group): "
                f"{report}; records {len(recorded)} for {len(seen)} completed requests"
            )
            # Exactly one record each; the rest were journaled for requests whose replies
            # the kill cut off (at most those in flight, a cycle's concurrency).
            assert len(set(seen)) == len(seen)
            assert len(set(recorded)) == len(recorded)
            assert set(seen) <= set(recorded)
            assert 0 <= extra <= CYCLES * CONCURRENCY
            assert rollup_requests(stack.engine) == len(recorded)
        finally:
            stack.close()
