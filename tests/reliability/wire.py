"""Talking HTTP/1.1 to a gateway byte by byte, and reading its memory: for the tests of
slow, oversized and malformed clients."""

from __future__ import annotations

import json
import socket
import time
from contextlib import suppress
from pathlib import Path

from tests.faults.conftest import MODEL, Stack, make_stack
from tests.faults.probes import metric

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


def slow_clients_stack(tmp: Path, **env: str) -> Stack:
    """A gateway with short header and body deadlines (and ``env``), one instant sim."""
    return make_stack(
        tmp,
        f"sqlite:///{tmp / 'kvgate.db'}",
        replicas=1,
        KVGATE_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        KVGATE_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        KVGATE_LOG_LEVEL="info",
        **env,
    )


def address(stack: Stack) -> tuple[str, int]:
    host, port = stack.url.removeprefix("http://").split(":")
    return host, int(port)


def connect(stack: Stack) -> socket.socket:
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


def head(stack: Stack, extra: str = "", path: str = CHAT) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {stack.key}\r\n"
        f"Content-Type: application/json\r\n{extra}"
    ).encode()


def disconnects(stack: Stack) -> float:
    return metric(stack.url, "kvgate_client_disconnects_total", 'phase="body"')


def wait_for(condition: object, timeout_s: float = SLACK_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


def status_kib(pid: int, field: str) -> int:
    """One memory figure of /proc/PID/status (VmRSS, VmHWM), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(f"no {field} for {pid}")


def reset_peak(pid: int) -> None:
    """Start VmHWM afresh from the current RSS (Linux 4.0+)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
