"""A replica SIGKILLed under load: its streams in flight end with a clear error and are
recorded failed with the tokens they had produced; new requests stop going to it within a
second; once back it is used again. Nothing a client saw complete lacks its record."""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from gateway.db.models import RequestRow
from tests.faults.conftest import MODEL, make_stack
from tests.faults.load import Load
from tests.faults.probes import metric
from tests.support.processes import start_sim, wait_recorded

pytestmark = pytest.mark.e2e
# 100 output tokens at 50 tokens/s: every request lasts two seconds, so a third of the
# ~60 in flight are on the replica when it dies.
SIM_ARGS = ("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "50")
IN_FLIGHT = 14  # on the victim when it is killed, about half of them streams


def output_tokens(body: bytes) -> tuple[int, dict[str, object] | None]:
    """Content chunks a client received, and the error event that ended the stream."""
    tokens, error = 0, None
    for line in body.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            error = chunk["error"]
        for choice in chunk.get("choices") or ():
            tokens += bool(choice["delta"].get("content"))
    return tokens, error


def test_a_killed_replica_fails_its_streams_cleanly_and_is_routed_around(
    tmp_path: Path,
) -> None:
    stack = make_stack(
        tmp_path,
        f"sqlite:///{tmp_path / 'kvgate.db'}",
        replicas=3,
        sim_args=SIM_ARGS,
        deployment={"connect_timeout_s": 1},
        # A cool-down shorter than the health checks' interval (5 s): a replica that is
        # out must stay out until a health check passes, not come back when it ends.
    )
    victim = stack.sims[0]
    try:
        load = Load(stack.url, stack.key, MODEL, rate=30, concurrency=128, max_tokens=100)
        load.start()
        time.sleep(4)
        # Killed with streams under way on it: on a busy machine the router may have sent
        # it fewer for a while (a late health check keeps a replica out until one passes).
        deadline = time.monotonic() + 30
        while metric(victim.url, "vllm:num_requests_running") < IN_FLIGHT:
            assert time.monotonic() < deadline, "the victim never had the load on it"
            time.sleep(0.05)
        killed_at = datetime.now(UTC)
        victim.stop(signal.SIGKILL)
        time.sleep(5)
        port = int(victim.url.rsplit(":", 1)[1])
        # Dead until its replacement starts: a health check may pass (and route to it)
        # before start_sim returns, so 'late' ends here, not at back_at.
        restarting_at = datetime.now(UTC)
        stack.sims[0] = start_sim(tmp_path, port=port, extra=SIM_ARGS)
        back_at = datetime.now(UTC)
        time.sleep(8)  # health checks run every 5 s
        tally = load.stop()
        wait_recorded(stack.url)
        with stack.engine.connect() as connection:
            rows = list(connection.execute(select(RequestRow)))

        by_id = {r.request_id: r for r in rows}
        on_victim = [r for r in rows if r.upstream == victim.url]
        failed = [r for r in on_victim if r.status == "failed"]
        # Failed before a byte reached the client (a plain request, or a stream still
        # connecting): failed over as attempt 2. Failed mid-stream: the client was told.
        failed_over = [r for r in failed if r.request_id + ".2" in by_id]
        broken = {r.request_id: r for r in failed if r.request_id + ".2" not in by_id}
        late = [
            r for r in on_victim if killed_at + timedelta(seconds=1) < r.started_at < restarting_at
        ]
        again = [r for r in on_victim if r.started_at > back_at and r.status == "completed"]
        tried = [
            r.started_at - killed_at for r in on_victim if killed_at < r.started_at < restarting_at
        ]
        print(
            f"attempts on the dead replica: {len(tried)}, the last "
            f"{max(tried, default=timedelta(0)).total_seconds() * 1000:.0f} ms after the kill"
        )
        print(
            f"killed with {len(failed)} in flight on it: {len(broken)} streams cut, "
            f"{len(failed_over)} failed over; attempts on it later than 1 s after the kill: "
            f"{len(late)}; back in use: {len(again)} requests; clients: {dict(tally.statuses)}"
        )
        assert len(broken) >= 5
        # The clients of those streams, and only they, saw a stream end in a clear error.
        assert set(tally.broken) == set(broken)
        for request_id, body in tally.broken.items():
            tokens, error = output_tokens(body)
            record = broken[request_id]
            assert record.stream
            assert error is not None and error["type"] == "upstream_error"
            assert str(error["message"]).startswith(f"upstream stream broke: {victim.url}")
            assert record.error == error["message"]
            # Recorded with the tokens produced, exactly what the client received.
            assert record.output_tokens == tokens
            assert record.usage_source == "estimated"
        assert sum(r.output_tokens for r in broken.values()) > 0
        for record in failed_over:
            retry = by_id[record.request_id + ".2"]
            assert retry.status == "completed" and retry.upstream != victim.url
        assert late == []
        assert again
        # Every request a client saw complete has its completed record (a failover's is
        # attempt 2, ``<id>.2``), and nothing else completed.
        completed = sorted(r.request_id.split(".")[0] for r in rows if r.status == "completed")
        assert completed == sorted(tally.completed)
        assert set(tally.statuses) == {200}
    finally:
        stack.close()
