"""Slow and oversized clients, before authentication: what one may hold, and for how long.

A real `kvgate serve` with a 2 s header timeout and a 2 s body deadline. A request head
that is too large gets a 431 and the connection closed (however much more the client
would send); a head or body that stalls gets a 408 and is closed; a connection that sends
nothing is closed; a client that hangs up while its body is read is counted and logged
in one line. tests/reliability/test_many_slow_clients.py holds 2,000 of them at once.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import suppress

import pytest

from tests.faults.conftest import Stack
from tests.reliability.wire import (
    BODY_TIMEOUT_S,
    CHAT,
    HEADER_TIMEOUT_S,
    MAX_HEADER_BYTES,
    SLACK_S,
    SMALL_CHAT,
    address,
    connect,
    disconnects,
    error_answer,
    head,
    read_to_close,
    reset_peak,
    slow_clients_stack,
    status_kib,
    wait_for,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = slow_clients_stack(tmp_path_factory.mktemp("slow-clients"))
    try:
        yield stack
    finally:
        stack.close()


def test_a_complete_head_past_the_size_limit_is_a_431(stack: Stack) -> None:
    sock = connect(stack)
    sock.sendall(head(stack, f"X-Padding: {'a' * 64 * 1024}\r\n\r\n"))
    status, error = error_answer(read_to_close(sock))
    assert status == 431
    assert error == {
        "message": f"the request head exceeds {MAX_HEADER_BYTES} bytes",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_header_fields_too_large",
    }


def test_an_endless_head_is_cut_at_the_size_limit_without_growing_the_gateway(
    stack: Stack,
) -> None:
    """64 MiB of one header value, never terminated: a 431 after the first 32 KiB or so,
    and the gateway's peak memory hardly moves (it grew by ~70 MiB before)."""
    assert stack.gateway is not None
    pid = stack.gateway.process.pid
    before = status_kib(pid, "VmRSS")
    reset_peak(pid)
    sock = connect(stack)
    sent = [0]

    def flood() -> None:
        piece = memoryview(b"a" * (64 << 20))
        with suppress(OSError):
            sock.sendall(head(stack, "X-Endless: "))
            while sent[0] < len(piece):
                sent[0] += sock.send(piece[sent[0] : sent[0] + (1 << 20)])

    sender = threading.Thread(target=flood)
    sender.start()
    received = b""
    with suppress(ConnectionResetError):
        received = sock.recv(65536)
    sender.join(timeout=SLACK_S)
    sock.close()
    peak = status_kib(pid, "VmHWM")
    print(f"\nsent {sent[0] / 1024:.0f} KiB before the gateway closed; peak +{peak - before} KiB")
    assert received.startswith(b"HTTP/1.1 431 ")
    assert sent[0] < 64 << 20
    assert (peak - before) * 1024 < 4 * 2**20


def test_a_head_that_stalls_is_a_408_and_closed(stack: Stack) -> None:
    sock = connect(stack)
    sock.sendall(head(stack, "X-Never: finished"))
    status, error = error_answer(read_to_close(sock))
    assert status == 408
    assert error["message"] == f"the request head was not received within {HEADER_TIMEOUT_S:g} s"
    assert error["code"] == "request_timeout"


def test_a_connection_that_sends_nothing_is_closed(stack: Stack) -> None:
    assert read_to_close(connect(stack)) == b""


def test_a_kept_alive_connection_may_idle_longer_than_the_header_timeout(
    stack: Stack,
) -> None:
    """The head is timed from its own first byte, not from the connection: a client that
    waits between requests (within uvicorn's 5 s keep-alive) keeps its connection."""
    connection = http.client.HTTPConnection(*address(stack), timeout=SLACK_S)
    headers = {"Authorization": f"Bearer {stack.key}", "Content-Type": "application/json"}
    connection.request("POST", CHAT, SMALL_CHAT, headers)
    first = connection.getresponse()
    assert first.status == 200 and first.read()
    sock = connection.sock
    time.sleep(HEADER_TIMEOUT_S + 1)
    connection.request("POST", CHAT, SMALL_CHAT, headers)
    second = connection.getresponse()
    assert second.status == 200 and second.read()
    assert connection.sock is sock  # the same connection, not a new one
    connection.close()


def test_a_body_shorter_than_its_content_length_is_a_408_and_counted(
    stack: Stack,
) -> None:
    counted = disconnects(stack)
    sock = connect(stack)
    sock.sendall(head(stack, "Content-Length: 1000\r\n\r\n") + b'{"model": ')
    status, error = error_answer(read_to_close(sock))
    assert status == 408
    assert error["message"] == f"the request body was not received within {BODY_TIMEOUT_S:g} s"
    wait_for(lambda: disconnects(stack) == counted + 1)


def test_a_client_hanging_up_mid_body_is_counted_and_logged_in_one_line(
    stack: Stack,
) -> None:
    assert stack.gateway is not None
    offset = stack.gateway.log.stat().st_size
    counted = disconnects(stack)
    sock = connect(stack)
    sock.sendall(head(stack, "Content-Length: 1000\r\n\r\n") + b'{"model": ')
    time.sleep(0.3)  # the handler is reading the body
    sock.close()
    wait_for(lambda: disconnects(stack) == counted + 1)
    with stack.gateway.log.open("rb") as log:
        log.seek(offset)
        logged = log.read().decode(errors="replace")
    lines = [line for line in logged.splitlines() if "client gone" in line]
    assert len(lines) == 1, logged
    assert (
        " INFO kvgate.inference: client gone while its body was read (10 of 1000 bytes)"
        in (lines[0])
    )
    assert "Traceback" not in logged and " ERROR " not in logged
