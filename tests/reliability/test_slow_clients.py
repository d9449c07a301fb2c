"""Slow and oversized clients, before authentication: what one may hold, and for how long.

A real `kvgate serve` with a 2 s header timeout and a 2 s body deadline. A request head
that is too large gets a 431 and the connection closed (however much more the client
would send); a head or body that stalls gets a 408 and is closed; a connection that sends
nothing is closed; a client that hangs up while its body is read is counted and logged
in one line. Then 2,000 such connections at once, while ordinary clients keep being
served; the latency those clients see is printed (benchmarks/slow_clients.py compares it
with no slow clients at all: a timed assertion does not belong in a test).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import resource
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.faults.conftest import MODEL, FaultStack, make_stack
from tests.faults.probes import metric, rss_kib
from tests.reliability.test_large_bodies import reset_peak, status_kib
from tests.support.processes import start_gateway

pytestmark = pytest.mark.e2e

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
MAX_HEADER_BYTES = 32 * 1024  # the default
# Every deadline is judged by whether the connection was closed at all: "never" is the
# failure, and a busy machine may well be late by seconds.
SLACK_S = 15.0
CHAT = "/v1/chat/completions"
SMALL_CHAT = json.dumps(
    {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
).encode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    tmp = tmp_path_factory.mktemp("slow-clients")
    stack = make_stack(
        tmp,
        f"sqlite:///{tmp / 'kvgate.db'}",
        replicas=1,
        KVGATE_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        KVGATE_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        KVGATE_LOG_LEVEL="info",
    )
    try:
        yield stack
    finally:
        stack.close()


def address(stack: FaultStack) -> tuple[str, int]:
    host, port = stack.url.removeprefix("http://").split(":")
    return host, int(port)


def connect(stack: FaultStack) -> socket.socket:
    sock = socket.create_connection(address(stack))
    sock.settimeout(HEADER_TIMEOUT_S + SLACK_S)
    return sock


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the gateway sends until it closes; a reset counts as closed."""
    received = b""
    with suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    sock.close()
    return received


def error_answer(raw: bytes) -> tuple[int, dict[str, object]]:
    """Status and OpenAI-shaped error of a whole response that closes its connection."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert "connection: close" in lines
    document = json.loads(body)
    assert list(document) == ["error"] and sorted(document["error"]) == [
        "code",
        "message",
        "param",
        "type",
    ]
    return int(lines[0].split()[1]), document["error"]


def head(stack: FaultStack, extra: str = "", path: str = CHAT) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {stack.key}\r\n"
        f"Content-Type: application/json\r\n{extra}"
    ).encode()


def disconnects(stack: FaultStack) -> float:
    return metric(stack.url, "kvgate_client_disconnects_total", 'phase="body"')


def test_a_complete_head_past_the_size_limit_is_a_431(stack: FaultStack) -> None:
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
    stack: FaultStack,
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


def test_a_head_that_stalls_is_a_408_and_closed(stack: FaultStack) -> None:
    sock = connect(stack)
    sock.sendall(head(stack, "X-Never: finished"))
    status, error = error_answer(read_to_close(sock))
    assert status == 408
    assert error["message"] == f"the request head was not received within {HEADER_TIMEOUT_S:g} s"
    assert error["code"] == "request_timeout"


def test_a_connection_that_sends_nothing_is_closed(stack: FaultStack) -> None:
    assert read_to_close(connect(stack)) == b""


def test_a_kept_alive_connection_may_idle_longer_than_the_header_timeout(
    stack: FaultStack,
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
    stack: FaultStack,
) -> None:
    counted = disconnects(stack)
    sock = connect(stack)
    sock.sendall(head(stack, "Content-Length: 1000\r\n\r\n") + b'{"model": ')
    status, error = error_answer(read_to_close(sock))
    assert status == 408
    assert error["message"] == f"the request body was not received within {BODY_TIMEOUT_S:g} s"
    wait_for(lambda: disconnects(stack) == counted + 1)


def test_a_client_hanging_up_mid_body_is_counted_and_logged_in_one_line(
    stack: FaultStack,
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


def wait_for(condition: object, timeout_s: float = SLACK_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


# -- 2,000 at once --------------------------------------------------------------------------

SLOW_CONNECTIONS = 2000
NORMAL_CLIENTS = 4
PER_CONNECTION = 16 * 1024


async def trickle(stack: FaultStack) -> tuple[str, float, bytes]:
    """A head sent one byte every half second: never done within the header timeout."""
    reader, writer = await asyncio.open_connection(*address(stack))
    opened = time.monotonic()
    data = head(stack, "X-Slowly: " + "a" * 200)

    writer.write(data[:1])  # at once: the gateway times the head from its connection

    async def drip() -> None:
        for byte in data[1:]:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.5)

    dripping = asyncio.ensure_future(drip())
    try:
        return "trickle", *(await until_closed(reader, opened))
    finally:
        dripping.cancel()
        writer.close()


async def unterminated(stack: FaultStack) -> tuple[str, float, bytes]:
    """Most of the size limit of head at once, then nothing: held until the timeout."""
    reader, writer = await asyncio.open_connection(*address(stack))
    opened = time.monotonic()
    writer.write(head(stack, "X-Big: " + "a" * (MAX_HEADER_BYTES - 2048)))
    try:
        return "unterminated", *(await until_closed(reader, opened))
    finally:
        writer.close()


async def short_body(stack: FaultStack) -> tuple[str, float, bytes]:
    """A whole head, then ten bytes of the thousand it promised."""
    reader, writer = await asyncio.open_connection(*address(stack))
    opened = time.monotonic()
    writer.write(head(stack, "Content-Length: 1000\r\n\r\n") + b'{"model": ')
    try:
        return "short body", *(await until_closed(reader, opened))
    finally:
        writer.close()


async def until_closed(reader: asyncio.StreamReader, opened: float) -> tuple[float, bytes]:
    """Seconds until the gateway closed the connection, and what it said first."""
    received = b""
    with suppress(ConnectionResetError):
        received = await asyncio.wait_for(reader.read(), HEADER_TIMEOUT_S + SLACK_S)
    return time.monotonic() - opened, received[:32]


async def normal_clients(stack: FaultStack, stop: asyncio.Event) -> list[tuple[int, float]]:
    """Ordinary chat completions, back to back from a few clients, until ``stop``."""
    results: list[tuple[int, float]] = []
    headers = {"authorization": f"Bearer {stack.key}", "content-type": "application/json"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def client() -> None:
            while not stop.is_set():
                started = time.monotonic()
                async with session.post(stack.url + CHAT, data=SMALL_CHAT, headers=headers) as r:
                    await r.read()
                results.append((r.status, time.monotonic() - started))

        await asyncio.gather(*(client() for _ in range(NORMAL_CLIENTS)))
    return results


def p99_ms(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] * 1000


@pytest.fixture
def open_files() -> Iterator[None]:
    """Room for the test's own 2,000 connections (the gateway raises its own limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = SLOW_CONNECTIONS + 512
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_two_thousand_slow_connections_are_cut_while_normal_clients_are_served(
    stack: FaultStack, open_files: None
) -> None:
    assert stack.gateway is not None
    pid = stack.gateway.process.pid
    kinds = [trickle, unterminated, short_body]

    async def run() -> tuple[list[tuple[str, float, bytes]], list[tuple[int, float]]]:
        stop = asyncio.Event()
        normal = asyncio.ensure_future(normal_clients(stack, stop))
        await asyncio.sleep(1.0)
        slow = [
            asyncio.ensure_future(kinds[i % len(kinds)](stack)) for i in range(SLOW_CONNECTIONS)
        ]
        cut = await asyncio.gather(*slow)
        await asyncio.sleep(1.0)
        stop.set()
        return cut, await normal

    before = rss_kib(pid)
    reset_peak(pid)
    cut, normal = asyncio.run(run())
    held = status_kib(pid, "VmHWM")
    answers = Counter((kind, first[:12]) for kind, _, first in cut)
    latest = {kind: max(s for k, s, _ in cut if k == kind) for kind, _, _ in cut}
    statuses = Counter(status for status, _ in normal)
    print(
        f"\n{SLOW_CONNECTIONS} slow connections: answers {dict(answers)}; last closed after "
        + ", ".join(f"{kind} {s:.2f} s" for kind, s in latest.items())
        + f"; gateway RSS {before / 1024:.1f} MiB before, peak {held / 1024:.1f} MiB with them"
        f" open; normal clients: {len(normal)} requests, p99 "
        f"{p99_ms([s for _, s in normal]):.1f} ms"
    )
    assert answers == {
        ("trickle", b"HTTP/1.1 408"): 667,
        ("unterminated", b"HTTP/1.1 408"): 667,
        ("short body", b"HTTP/1.1 408"): 666,
    }
    assert statuses == {200: len(normal)}
    # Bounded by what was sent (the unterminated heads' 30 KiB each) and a little per
    # connection, its protocol, parser and (for the short bodies) handler waiting.
    unterminated_bytes = SLOW_CONNECTIONS // 3 * MAX_HEADER_BYTES
    assert (held - before) * 1024 < unterminated_bytes + SLOW_CONNECTIONS * PER_CONNECTION


# -- the connection cap ---------------------------------------------------------------------

CAP = 32


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    tmp = tmp_path_factory.mktemp("capped")
    stack = make_stack(
        tmp,
        f"sqlite:///{tmp / 'kvgate.db'}",
        replicas=1,
        KVGATE_MAX_CONNECTIONS=str(CAP),
        KVGATE_HEADER_TIMEOUT_S="30",
    )
    try:
        yield stack
    finally:
        stack.close()


def chat_with_openai(stack: FaultStack, max_retries: int) -> str:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key, max_retries=max_retries)
    reply = client.chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    return reply.choices[0].finish_reason


def test_past_the_connection_cap_a_client_gets_a_503_to_retry_and_then_is_served(
    capped: FaultStack,
) -> None:
    """The official client sees a 503 in OpenAI's error shape with retry-after; with its
    default retries it waits that second and is served once connections are free."""
    held = [connect(capped) for _ in range(CAP)]
    try:
        with pytest.raises(openai.APIStatusError) as refused:
            chat_with_openai(capped, max_retries=0)
        assert refused.value.status_code == 503
        assert refused.value.response.headers["retry-after"] == "1"
        assert refused.value.response.json() == {
            "error": {
                "message": f"the gateway has {CAP} connections open, its limit; retry shortly",
                "type": "service_unavailable",
                "param": None,
                "code": "too_many_connections",
            }
        }
        release = threading.Timer(0.3, lambda: [sock.close() for sock in held])
        release.start()
        assert chat_with_openai(capped, max_retries=2) == "length"
        release.join()
    finally:
        for sock in held:
            sock.close()


def test_the_limits_hold_in_every_worker_of_a_multi_worker_gateway(
    tmp_path: Path,
) -> None:
    """`--workers 2` (uvicorn's process supervisor): each worker answers a stalled head
    with a 408 and an oversized one with a 431."""
    stack = make_stack(
        tmp_path,
        f"sqlite:///{tmp_path / 'kvgate.db'}",
        replicas=1,
        start=False,
        KVGATE_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
    )
    stack.gateway = start_gateway(tmp_path, stack.config, stack.env, args=("--workers", "2"))
    try:
        # Several connections, so that both workers take some (the kernel spreads them).
        socks = [connect(stack) for _ in range(8)]
        for sock in socks:
            sock.sendall(head(stack, "X-Never: finished"))
        assert {error_answer(read_to_close(sock))[0] for sock in socks} == {408}
        sock = connect(stack)
        sock.sendall(head(stack, f"X-Padding: {'a' * 64 * 1024}\r\n\r\n"))
        assert error_answer(read_to_close(sock))[0] == 431
    finally:
        stack.close()
