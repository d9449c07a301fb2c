"""The journal's disk full: refuse with a clear 503 (the default) or serve and write
records straight to the database (``KVGATE_REFUSE_WHEN_UNRECORDABLE=false``); recover
when space returns; never a 200 without its record.

"Full" is RLIMIT_FSIZE on the running gateway (``prlimit``): we run as root, so file
permissions would not stop a write, and mounting a small filesystem needs privileges a
container may not have. Past the limit ``write`` fails with EFBIG (Python ignores
SIGXFSZ), and a write that crosses it is cut short, as on a disk that fills mid-write.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.accounting.journal import segments
from tests.faults.conftest import MODEL, FaultStack, make_stack
from tests.faults.load import Load, Tally
from tests.faults.probes import completed_ids, healthz
from tests.support.processes import wait_recorded

pytestmark = pytest.mark.e2e
FULL_S = 3.0
# Requests take about a second (100 tokens at 100 tokens/s), so many are in flight when
# the disk fills and when space returns.
SIM_ARGS = ("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "100")


def limit_file_size(pid: int, limit: int | str) -> None:
    """Set the soft limit only: raising a hard limit again needs CAP_SYS_RESOURCE."""
    subprocess.run(["prlimit", "--pid", str(pid), f"--fsize={limit}:unlimited"], check=True)


def fill_the_disk(stack: FaultStack) -> float:
    """Let the journal's segment grow by a few hundred bytes more, then fail (mid-record)."""
    assert stack.gateway is not None
    size = max(p.stat().st_size for p in segments(stack.tmp / "journal"))
    limit_file_size(stack.gateway.process.pid, size + 700)
    return time.monotonic()


def free_space(stack: FaultStack) -> float:
    assert stack.gateway is not None
    limit_file_size(stack.gateway.process.pid, "unlimited")
    return time.monotonic()


@dataclass
class Run:
    tally: Tally
    full_at: float
    freed_at: float
    writable: list[bool]  # /healthz journal_writable while full, twice a second
    writable_again_s: float  # from space returning to /healthz journal_writable


def run_through_a_full_disk(stack: FaultStack) -> Run:
    load = Load(stack.url, stack.key, MODEL, rate=40, concurrency=64, max_tokens=100).start()
    time.sleep(3)
    full_at = fill_the_disk(stack)
    writable = []
    while time.monotonic() - full_at < FULL_S:
        time.sleep(0.5)
        writable.append(bool(healthz(stack.url)["journal_writable"]))
    freed_at = free_space(stack)
    while not healthz(stack.url)["journal_writable"]:
        assert time.monotonic() - freed_at < 10, "the journal did not recover"
        time.sleep(0.05)
    writable_again_s = time.monotonic() - freed_at
    time.sleep(4)
    tally = load.stop()
    wait_recorded(stack.url, timeout_s=30)
    return Run(tally, full_at, freed_at, writable, writable_again_s)


def test_a_full_journal_disk_refuses_with_503_and_recovers(tmp_path: Path) -> None:
    stack = make_stack(tmp_path, f"sqlite:///{tmp_path / 'kvgate.db'}", sim_args=SIM_ARGS)
    try:
        run = run_through_a_full_disk(stack)
        tally = run.tally
        print(
            f"full for {FULL_S:.0f} s at 40/s: {tally.statuses[503]} refused (503), "
            f"{len(tally.errors)} cut (stream or reply), {len(tally.completed)} completed; "
            f"accepting again {run.writable_again_s:.2f} s after space returned"
        )
        assert run.writable[-1] is False
        assert tally.statuses[503] > 0
        body = json.loads(tally.refusals[-1])
        assert body == {
            "error": {
                "message": "the gateway cannot record requests right now; retry shortly",
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


def test_a_full_journal_disk_can_be_served_through_into_the_database(tmp_path: Path) -> None:
    stack = make_stack(
        tmp_path,
        f"sqlite:///{tmp_path / 'kvgate.db'}",
        sim_args=SIM_ARGS,
        KVGATE_REFUSE_WHEN_UNRECORDABLE="false",
    )
    try:
        run = run_through_a_full_disk(stack)
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
