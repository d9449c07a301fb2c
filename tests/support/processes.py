"""Real processes on loopback for tests: `kvgate sim` replicas, the provider emulator and
`kvgate serve` gateways (tests/support/stack.py puts them together), and plain HTTP to them."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

_GIVEN: set[int] = set()  # the ports this process handed out


def _ports_below_ephemeral() -> tuple[int, int]:
    """Listening ports to choose from: below the kernel's ephemeral range, from which
    every outbound connection takes its source port."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return 10000, max(low - 1, 10001)


def free_port() -> int:
    """A port free now, outside the ephemeral range and never handed out before by this
    process. A server that binds it seconds later (vLLM takes half a minute) does not race
    the source port of some outbound connection meanwhile ("Address already in use")."""
    first, last = _ports_below_ephemeral()
    for _ in range(500):
        port = random.randint(first, last)
        if port in _GIVEN:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(
    url: str, timeout_s: float = 60.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} was ready")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
            if reply.status == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


@dataclass
class Proc:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def kvgate(
    *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (``python -m gateway.cli``)."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        env=env,
        text=True,
        capture_output=True,
        check=check,
        timeout=120,
    )


def cli_tenant(env: dict[str, str], name: str) -> tuple[str, str]:
    """A tenant and one key made through the real CLI: (key, key id)."""
    kvgate("tenants", "create", name, env=env)
    out = kvgate("keys", "create", "--tenant", name, env=env).stdout
    lines = out.strip().splitlines()  # "key <id> ...", then the key alone on the last
    key, key_id = lines[-1], lines[0].split()[1]
    assert key.startswith("kvg-") and " " not in key
    return key, key_id


def start_sim(
    tmp: Path,
    *,
    model: str = "kvgate/demo-llama-8b",
    extra: tuple[str, ...] = (),
    port: int | None = None,
) -> Proc:
    port = port or free_port()
    log = tmp / f"sim-{port}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "sim", "--port", str(port), "--model", model, *extra],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", process=process)
    return Proc(process, url, log)


def start_emulator(tmp: Path, *args: str) -> Proc:
    """tests/providers' emulator of hosted providers (``args``: its options), in a process."""
    port = free_port()
    log = tmp / f"emulator-{port}.log"
    command = [sys.executable, "-m", "tests.providers.emulator", "--port", str(port), *args]
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", process=process)
    return Proc(process, url, log)


def gateway_env(database_url: str, journal_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update(
        {
            "KVGATE_DATABASE_URL": database_url,
            "KVGATE_JOURNAL_DIR": str(journal_dir),
            "KVGATE_KEY_REFRESH_S": "0.5",
            "KVGATE_PRICE_REFRESH_S": "0.5",
            "KVGATE_RECORDER_FLUSH_INTERVAL_S": "0.05",
            "KVGATE_LOG_LEVEL": "warning",
            **extra,
        }
    )
    return env


def start_gateway(
    tmp: Path,
    config: Path,
    env: dict[str, str],
    port: int | None = None,
    args: Sequence[str] = (),
) -> Proc:
    port = port or free_port()
    log = tmp / f"gateway-{port}.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            *args,
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: a test can kill it with its children
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/healthz", process=process)
        wait_ready_to_record(url)
    except BaseException:
        print(log.read_text(errors="replace"))
        # Never leave a gateway that did not start (nor its writer) running after the test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return Proc(process, url, log)


def wait_ready_to_record(gateway_url: str, timeout_s: float = 30.0) -> None:
    """Wait until the gateway's database writer has started (it runs in its own process)."""
    import json

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(gateway_url + "/healthz", timeout=2) as reply:
            if json.loads(reply.read())["recorder_ready"]:
                return
        time.sleep(0.05)
    raise TimeoutError(f"the database writer of {gateway_url} did not start in {timeout_s} s")


@contextlib.contextmanager
def running(*procs: Proc) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            proc.stop()


def wait_recorded(gateway_url: str, timeout_s: float = 15.0) -> None:
    """Wait until the gateway reports every record it accepted written to the database."""
    import json

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(gateway_url + "/healthz", timeout=2) as reply:
            if json.loads(reply.read())["recorder_backlog"] == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"records of {gateway_url} not written after {timeout_s} s")


def call(
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request (a POST when it has a body); (status, headers, body) whatever the
    status."""
    request = urllib.request.Request(
        url, data=body, headers=headers or {}, method=method or ("GET" if body is None else "POST")
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()
