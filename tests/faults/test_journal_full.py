"""The journal's disk full: refuse with a clear 503 (the default) or serve and write
records straight to the database (``KVGATE_REFUSE_WHEN_UNRECORDABLE=false``); recover
when space returns; never a 200 without its record.

Each runs twice: the gateway's RLIMIT_FSIZE lowered (EFBIG), and the journal on a small
tmpfs filled up (ENOSPC; skipped where mounting is not allowed). See ``disks.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults.conftest import MODEL, Stack, make_stack
from tests.faults.disks import FileSizeLimit, SmallFilesystem
from tests.faults.load import Load, Tally
from tests.faults.probes import completed_ids, healthz
from tests.support.processes import wait_recorded

pytestmark = pytest.mark.e2e
FULL_S = 3.0
# Requests take about a second (100 tokens at 100 tokens/s), so many are in flight when
# the disk fills and when space returns.
SIM_ARGS = ("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "100")


Disk = FileSizeLimit | SmallFilesystem
REFUSED = "the gateway cannot record requests right now; retry shortly"
NOT_KEPT = "the record of this request could not be kept"


@pytest.fixture(params=["rlimit", "tmpfs"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disk]:
    made: Disk = FileSizeLimit(tmp_path) if request.param == "rlimit" else SmallFilesystem(tmp_path)
    yield made
    made.close()


@dataclass
class Run:
    tally: Tally
    full_at: float
    freed_at: float
    writable: list[bool]  # /healthz journal_writable while full, twice a second
    writable_again_s: float  # from space returning to /healthz journal_writable


def run_through_a_full_disk(stack: Stack, disk: Disk) -> Run:
    load = Load(stack.url, stack.key, MODEL, rate=40, concurrency=64, max_tokens=100).start()
    time.sleep(3)
    assert stack.gateway is not None
    disk.fill(stack.gateway.process.pid)
    full_at = time.monotonic()
    writable = []
    while time.monotonic() - full_at < FULL_S:
        time.sleep(0.5)
        writable.append(bool(healthz(stack.url)["journal_writable"]))
    disk.free(stack.gateway.process.pid)
    freed_at = time.monotonic()
    while not healthz(stack.url)["journal_writable"]:
        assert time.monotonic() - freed_at < 10, "the journal did not recover"
        time.sleep(0.05)
    writable_again_s = time.monotonic() - freed_at
    time.sleep(4)
    tally = load.stop()
    wait_recorded(stack.url, timeout_s=30)
    return Run(tally, full_at, freed_at, writable, writable_again_s)


def test_a_full_journal_disk_refuses_with_503_and_recovers(tmp_path: Path, disk: Disk) -> None:
    stack = make_stack(
        tmp_path,
        f"sqlite:///{tmp_path / 'kvgate.db'}",
        sim_args=SIM_ARGS,
        KVGATE_JOURNAL_DIR=str(disk.journal_dir),
    )
    try:
        run = run_through_a_full_disk(stack, disk)
        tally = run.tally
        print(
            f"full for {FULL_S:.0f} s at 40/s: {tally.statuses[503]} refused (503), "
            f"{len(tally.errors)} cut (stream or reply), {len(tally.completed)} completed; "
            f"accepting again {run.writable_again_s:.2f} s after space returned"
        )
        assert run.writable[-1] is False
        assert tally.statuses[503] > 0
        # Refused up front, or (in flight when the disk filled) served upstream but not
        # recordable: both in the OpenAI error shape, saying so.
        bodies = {json.loads(body)["error"]["message"]: json.loads(body) for body in tally.refusals}
        assert set(bodies) <= {REFUSED, NOT_KEPT} and REFUSED in bodies
        for message, body in bodies.items():
            assert body == {
                "error": {
                    "message": message,
                    "type": "service_unavailable",
                    "param": None,
                    "code": "recorder_unavailable",
                }
            }
        # Nothing completed while full (but requests that were in flight when the disk filled).
        assert tally.completed_between(run.full_at + 1.5, run.freed_at) == 0
        assert run.writable_again_s < 1.5  # the probe tries every second
        assert tally.completed_between(run.freed_at + 2.5, run.freed_at + 4) > 0
        # Every 200 has its record, and no client that saw a failure has a completed record.
        assert sorted(completed_ids(stack.engine)) == sorted(tally.completed)
    finally:
        stack.close()


def test_a_full_journal_disk_can_be_served_through_into_the_database(
    tmp_path: Path, disk: Disk
) -> None:
    stack = make_stack(
        tmp_path,
        f"sqlite:///{tmp_path / 'kvgate.db'}",
        sim_args=SIM_ARGS,
        KVGATE_JOURNAL_DIR=str(disk.journal_dir),
        KVGATE_REFUSE_WHEN_UNRECORDABLE="false",
    )
    try:
        run = run_through_a_full_disk(stack, disk)
        tally = run.tally
        print(
            f"full for {FULL_S:.0f} s at 40/s, refusing off: {dict(tally.statuses)}, "
            f"{len(tally.completed)} completed, "
            f"{tally.completed_between(run.full_at, run.freed_at)} while full; journal "
            f"writable again {run.writable_again_s:.2f} s after space returned"
        )
        assert run.writable[-1] is False
        assert tally.errors == []
        assert set(tally.statuses) == {200}
        assert tally.completed_between(run.full_at + 1.5, run.freed_at) >= 40 * (FULL_S - 2.5)
        assert run.writable_again_s < 1.5
        assert sorted(completed_ids(stack.engine)) == sorted(tally.completed)
    finally:
        stack.close()
