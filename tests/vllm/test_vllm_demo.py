"""`make vllm-demo` for real: a vLLM replica on the CPU and the gateway, stopped with Ctrl-C.

Ctrl-C is a SIGINT to the terminal's whole foreground process group (make, its shell, the
gateway); the test sends just that. The old recipe's trap (`kill 0`) signalled its own
shell, whose trap ran again, until dash overflowed its stack: make then reported
"Segmentation fault". The key printed is the tenant's, kept under the demo's directory and
used again on the next start.

make runs with ``-o install -o vllm-venv -o tiny-model``: the shared virtualenvs are never
reinstalled from a test, and the test builds the tiny model itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from tests.support.processes import free_port, wait_http
from tests.support.tiny_model import build_tiny_model
from tests.support.vllm import VLLM_VENV, require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
REPO = Path(__file__).resolve().parents[2]


class Demo:
    """One `make vllm-demo` in its own process group, as a terminal would run it."""

    def __init__(self, directory: Path, replica_port: int, gateway_port: int) -> None:
        self.log = directory / f"make-{time.monotonic_ns()}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KVGATE_", "MAKE"))}
        env["PYTHONPATH"] = str(REPO)  # this checkout's code, also in `.venv/bin/kvgate`
        self.process = subprocess.Popen(
            [
                "make",
                "-C",
                str(REPO),
                "--no-print-directory",
                "-o",
                "install",
                "-o",
                "vllm-venv",
                "-o",
                "tiny-model",
                "vllm-demo",
                f"VLLM_DIR={directory}",
                f"VLLM_VENV={VLLM_VENV}",
                f"VLLM_PORTS={replica_port}",
                f"VLLM_GATEWAY_PORT={gateway_port}",
            ],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{gateway_port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_serving(self) -> str:
        """Wait for the gateway; returns the API key the demo printed."""
        try:
            wait_http(self.url + "/healthz", timeout_s=600, process=self.process)
        except (RuntimeError, TimeoutError) as exc:
            replicas = "".join(
                log.read_text(errors="replace")[-3000:]
                for log in self.log.parent.glob("replica-*/*.log")
            )
            raise AssertionError(
                f"{exc}; make's output ends:\n{self.output()[-3000:]}\nreplicas:\n{replicas}"
            ) from None
        (line,) = [x for x in self.output().splitlines() if x.startswith("API key: ")]
        return line.removeprefix("API key: ")

    def ctrl_c(self, timeout_s: float = 120) -> int:
        if self.process.poll() is not None:
            return self.process.returncode
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: vLLM binds unix sockets under its TMPDIR, and a
    pytest tmp_path makes them longer than a socket path may be (107 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="kvd-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_ctrl_c_stops_everything_cleanly_and_the_key_is_kept(short_dir: Path) -> None:
    require_vllm()
    tmp_path = short_dir
    build_tiny_model(tmp_path / "tiny-model")
    replica, gateway = free_port(), free_port()
    keys = []
    for _ in range(2):
        demo = Demo(tmp_path, replica, gateway)
        try:
            key = demo.wait_serving()
            reply = OpenAI(base_url=demo.url + "/v1", api_key=key).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=2
            )
            assert reply.usage is not None and reply.usage.completion_tokens == 2
        finally:
            code = demo.ctrl_c()
        output = demo.output()
        assert "Segmentation fault" not in output, output[-3000:]
        assert "Finished server process" in output  # the gateway shut down, not killed
        assert code in (0, -signal.SIGINT), output[-3000:]  # make itself got the Ctrl-C
        assert not listening(replica) and not listening(gateway)
        assert "Application shutdown complete" in (
            tmp_path / f"replica-{replica}" / "vllm.log"
        ).read_text(errors="replace")
        keys.append(key)
    assert keys[0] == keys[1] and keys[0].startswith("kvg-")
    assert (tmp_path / "api-key").read_text().strip() == keys[0]
    assert (tmp_path / "api-key").stat().st_mode & 0o777 == 0o600
