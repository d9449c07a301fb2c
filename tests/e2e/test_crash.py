"""SIGKILL the gateway under load: every request a client saw complete has one record."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from sqlalchemy import func, select

from gateway.db.models import RequestRow
from tests.conftest import _backends, new_database
from tests.factories import vllm
from tests.support.processes import Proc, free_port
from tests.support.stack import running_stack

pytestmark = pytest.mark.e2e
MODEL = "kvgate/demo-llama-8b"


async def load(
    base_url: str, key: str, seen: list[str], stop_at: float, errors: list[str], workers: int = 16
) -> None:
    """Workers send mixed streaming and plain requests until the gateway dies or time is up."""
    client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=5)

    async def worker(n: int) -> None:
        i = 0
        while time.monotonic() < stop_at:
            i += 1
            messages = [{"role": "user", "content": f"worker {n} request {i} " * 20}]
            try:
                if i % 2:
                    reply = await client.chat.completions.with_raw_response.create(
                        model=MODEL, messages=messages, max_tokens=4
                    )
                    reply.parse()
                else:
                    reply = await client.chat.completions.with_raw_response.create(
                        model=MODEL, messages=messages, max_tokens=4, stream=True
                    )
                    chunks = [c async for c in reply.parse()]
                    assert chunks  # the stream ran to [DONE]
            except Exception as exc:
                errors.append(repr(exc))
                return  # the gateway is gone
            seen.append(reply.headers["x-request-id"])

    await asyncio.gather(*(worker(n) for n in range(workers)))
    await client.close()


async def load_then_kill(
    gateway: Proc, key: str, seen: list[str], errors: list[str], machine_crash: bool
) -> None:
    """Load the gateway; once 150 requests completed, SIGKILL it (with its writer or not)."""
    task = asyncio.ensure_future(
        load(gateway.url + "/v1", key, seen, time.monotonic() + 20, errors)
    )
    while len(seen) < 150 and not task.done():
        await asyncio.sleep(0.02)
    if machine_crash:
        os.killpg(gateway.process.pid, signal.SIGKILL)  # the writer dies too
        gateway.process.wait()
    else:
        gateway.stop(signal.SIGKILL)
    await task


@pytest.mark.parametrize(
    "backend", [p.values[0] for p in _backends()], ids=[p.id for p in _backends()]
)
def test_sigkill_under_load_loses_no_completed_request(backend: str, tmp_path: Path) -> None:
    with (
        new_database(backend, tmp_path) as database_url,
        # A long flush interval keeps records in the journal only, so the kill must be
        # survived by replaying it.
        running_stack(
            tmp_path,
            database_url,
            tenants=("crash",),
            KVGATE_RECORDER_FLUSH_INTERVAL_S="30",
            KVGATE_RECORDER_BATCH_SIZE="100000",
        ) as stack,
    ):
        stack.configure([vllm(MODEL, [s.url for s in stack.start_sims(2)])])
        port = free_port()
        engine, key = stack.engine, stack.key
        for cycle in range(2):
            # Cycle 0: the gateway and its database writer die at once (as in a machine
            # crash): the restarted gateway must replay the journal. Cycle 1: only the
            # gateway dies; its writer is told (PR_SET_PDEATHSIG) and drains the journal.
            machine_crash = cycle == 0
            gateway = stack.start_gateway(port=port)
            seen: list[str] = []
            errors: list[str] = []

            asyncio.run(load_then_kill(gateway, key, seen, errors, machine_crash))
            assert len(seen) >= 150, (errors[:3], gateway.output()[-2000:])

            assert gateway.process.returncode == -signal.SIGKILL
            if machine_crash:
                with engine.connect() as connection:
                    before = connection.scalar(
                        select(func.count()).where(RequestRow.request_id.in_(seen))
                    )
                assert before == 0, "records should have been in the journal only"
            survivor = stack.start_gateway(port=port)
            deadline = time.monotonic() + 30
            count = 0
            while time.monotonic() < deadline:
                with engine.connect() as connection:
                    count = connection.scalar(
                        select(func.count()).where(
                            RequestRow.request_id.in_(seen), RequestRow.status == "completed"
                        )
                    )
                if count == len(seen):
                    break
                time.sleep(0.1)
            survivor.stop()  # a clean stop drains its own journal too
            assert len(seen) >= 150
            assert count == len(seen), f"cycle {cycle}: {len(seen) - count} completed requests lost"
            assert len(set(seen)) == len(seen)
        with engine.connect() as connection:
            total = connection.scalar(select(func.count()).select_from(RequestRow))
            distinct = connection.scalar(select(func.count(func.distinct(RequestRow.request_id))))
        assert total == distinct
