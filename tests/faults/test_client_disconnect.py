"""Clients that hang up mid-stream: the upstream request is cancelled and the record says
``cancelled``, with the output tokens produced up to then."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import select

from gateway.db.models import RequestRow
from tests.faults.conftest import MODEL, make_stack
from tests.faults.probes import metric
from tests.support.processes import wait_recorded

pytestmark = pytest.mark.e2e
DECODE_TOKENS_PER_S = 20  # 50 ms a token: the client hangs up between two of them
CUT_AFTER = [1, 3, 5, 8, 13, 21, 34, 55]  # output tokens each client reads before hanging up


async def read_then_hang_up(url: str, key: str, tokens: int) -> tuple[str, int]:
    """Stream a long answer, read ``tokens`` content chunks, drop the connection."""
    body = {
        "model": MODEL,
        "max_tokens": 2000,
        "stream": True,
        "messages": [{"role": "user", "content": f"hang up after {tokens} tokens"}],
    }
    headers = {"authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session:
        reply = await session.post(url + "/v1/chat/completions", json=body, headers=headers)
        assert reply.status == 200
        seen = 0
        async for line in reply.content:
            if line.startswith(b"data: ") and b'"content":"' in line and b'"role"' not in line:
                seen += 1
                if seen == tokens:
                    break
        request_id = reply.headers["x-request-id"]
        reply.close()  # drops the connection mid-stream
    return request_id, seen


def test_a_client_hanging_up_cancels_upstream_and_is_recorded_cancelled(
    tmp_path: Path,
) -> None:
    stack = make_stack(
        tmp_path,
        f"sqlite:///{tmp_path / 'kvgate.db'}",
        replicas=1,
        sim_args=("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", str(DECODE_TOKENS_PER_S)),
    )
    sim = stack.sims[0].url
    try:

        async def all_clients() -> list[tuple[str, int]]:
            return await asyncio.gather(
                *(read_then_hang_up(stack.url, stack.key, n) for n in CUT_AFTER)
            )

        hung_up = asyncio.run(all_clients())
        hung_up_at = time.monotonic()
        # The replica stops generating: its running requests drop to zero at once ...
        while metric(sim, "vllm:num_requests_running") != 0.0:
            assert time.monotonic() - hung_up_at < 2, "upstream requests still running"
            time.sleep(0.02)
        cancelled_in = time.monotonic() - hung_up_at
        generated = metric(sim, "vllm:generation_tokens_total")
        time.sleep(0.5)  # ... and produces nothing more (10 tokens per stream if it did).
        assert metric(sim, "vllm:generation_tokens_total") == generated
        aborted = metric(sim, "vllm:request_success_total", 'finished_reason="abort"')

        wait_recorded(stack.url)
        with stack.engine.connect() as connection:
            rows = {r.request_id: r for r in connection.execute(select(RequestRow))}
        outputs = [rows[request_id].output_tokens for request_id, _ in hung_up]
        print(
            f"hung up after {CUT_AFTER} tokens; recorded {outputs}; upstream cancelled "
            f"{cancelled_in * 1000:.0f} ms after the last hang-up; replica generated "
            f"{generated:.0f} tokens in all"
        )
        assert aborted == len(CUT_AFTER)
        assert [seen for _, seen in hung_up] == CUT_AFTER
        for (request_id, seen), output in zip(hung_up, outputs, strict=True):
            row = rows[request_id]
            assert (row.status, row.error, row.usage_source) == (
                "cancelled",
                "client disconnected",
                "estimated",
            )
            # What the gateway relayed: what the client read, plus at most the token or two
            # in flight when it hung up (one every 50 ms).
            assert seen <= output <= seen + 2
            assert row.cost_output > 0
        # Every token the replica produced was recorded, none invented.
        assert sum(outputs) == generated
    finally:
        stack.close()
