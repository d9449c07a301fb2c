"""A slow client reading a huge stream: the gateway relays at the client's pace
(backpressure to the replica) and holds no more than a few buffers, however large the
answer waiting upstream."""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from gateway.db.models import RequestRow
from tests.faults.conftest import MODEL, make_stack
from tests.faults.probes import rss_kib
from tests.support.processes import wait_recorded

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOKENS = 300_000  # one chunk of about 220 bytes each: a 66 MB answer
SLOW_S = 12.0
SLOW_BYTES_PER_S = 64 * 1024
MAX_GROWTH_KIB = 16 * 1024  # a quarter of the answer: buffering it would show four times over


def test_a_slow_client_of_a_huge_stream_holds_gateway_memory_flat(tmp_path: Path) -> None:
    # Instant decode: the replica has the whole answer ready at once and writes it in one go.
    stack = make_stack(
        tmp_path,
        f"sqlite:///{tmp_path / 'kvgate.db'}",
        replicas=1,
        sim_args=(
            "--prefill-tokens-per-s",
            "0",
            "--decode-tokens-per-s",
            "0",
            "--max-model-len",
            str(TOKENS + 1000),
        ),
    )
    assert stack.gateway is not None
    pid = stack.gateway.process.pid
    try:
        before = rss_kib(pid)
        host, port = stack.url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        connection.connect()
        assert connection.sock is not None
        # A small receive window: the client's kernel buffers little on its behalf either.
        connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        body = {
            "model": MODEL,
            "max_tokens": TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "say a great deal"}],
        }
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={"authorization": f"Bearer {stack.key}", "content-type": "application/json"},
        )
        reply = connection.getresponse()
        assert reply.status == 200
        request_id = reply.headers["x-request-id"]

        started, received, peak = time.monotonic(), 0, before
        while time.monotonic() - started < SLOW_S:
            received += len(reply.read(SLOW_BYTES_PER_S // 8))
            peak = max(peak, rss_kib(pid))
            time.sleep(0.125)
        slow_received = received
        rest = b""
        while chunk := reply.read(1 << 20):
            received += len(chunk)
            rest = rest[-4096:] + chunk
            peak = max(peak, rss_kib(pid))
        connection.close()
        print(
            f"slow client: {slow_received / 1024:.0f} KiB in {SLOW_S:.0f} s, then the rest: "
            f"{received / 1e6:.1f} MB in all; gateway RSS {before / 1024:.1f} MiB before, "
            f"peak {peak / 1024:.1f} MiB (+{(peak - before) / 1024:.1f})"
        )
        # The client read at its own pace, and the whole answer arrived, to [DONE].
        assert slow_received <= SLOW_BYTES_PER_S * SLOW_S
        assert received > 200 * TOKENS
        assert rest.endswith(b"data: [DONE]\n\n")
        assert peak - before <= MAX_GROWTH_KIB
        wait_recorded(stack.url)
        with stack.engine.connect() as db:
            row = db.execute(select(RequestRow).where(RequestRow.request_id == request_id)).one()
        assert (row.status, row.output_tokens, row.usage_source) == (
            "completed",
            TOKENS,
            "reported",
        )
    finally:
        stack.close()
