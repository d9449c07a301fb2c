"""Real vLLM servers on loopback for tests, from the project's own `.venv-vllm`.

One server: the tiny local model, prefix caching with usage details, 32-token blocks
(CPU attention wants a multiple of 32), a small fixed KV cache (so that tests can evict),
and KV events on a PUB socket with a replay socket. Everything the server writes (caches,
config, temporary files) stays in its own directory. vLLM is never imported here: it runs
in its own virtualenv (``make vllm-venv``), apart from the gateway's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_port, wait_http

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("KVGATE_VLLM_VENV", REPO / ".venv-vllm"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
SERVED_NAME = "tiny"
BLOCK_SIZE = 32


class VllmUnavailable(RuntimeError):
    """The vLLM virtualenv is missing or a server would not start."""


def require_vllm() -> Path:
    """The vLLM interpreter, or a failure that says how to get one (never a skip)."""
    if not VLLM_PYTHON.exists():
        raise VllmUnavailable(
            f"no vLLM virtualenv at {VLLM_VENV}: run `make vllm-venv` (about 2 minutes, "
            "2.5 GB) or point KVGATE_VLLM_VENV at one; deselect with `-m 'not vllm'`"
        )
    return VLLM_PYTHON


@dataclass
class VllmServer:
    """One vLLM API server process and its endpoints."""

    process: subprocess.Popen[bytes]
    url: str
    port: int
    events_endpoint: str  # where a subscriber connects
    replay_endpoint: str
    events_port: int
    replay_port: int
    log: Path
    directory: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server and every process it started."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def launch_vllm(
    directory: Path,
    model: Path,
    *,
    port: int | None = None,
    events_port: int | None = None,
    replay_port: int | None = None,
    num_blocks: int = 48,
    max_model_len: int = 1024,
    extra_args: Sequence[str] = (),
) -> VllmServer:
    """Start a server (returns at once; `wait_ready` waits for it); ``extra_args`` go on
    its command line last."""
    python = require_vllm()
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    events_port = events_port or free_port()
    replay_port = replay_port or free_port()
    for sub in ("tmp", "cache", "config"):
        (directory / sub).mkdir(exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KVGATE_", "VIRTUAL_ENV", "PYTHONHASHSEED", "VLLM_"))
    }
    env.update(
        {
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "TMPDIR": str(directory / "tmp"),
            "VLLM_CACHE_ROOT": str(directory / "cache"),
            "VLLM_CONFIG_ROOT": str(directory / "config"),
        }
    )
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # "*" makes vLLM bind; a plain address would make it connect out.
        "endpoint": f"tcp://*:{events_port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
        "topic": "kv",
    }
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--block-size",
        str(BLOCK_SIZE),
        "--num-gpu-blocks-override",
        str(num_blocks),
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--dtype",
        "float32",
        "--distributed-executor-backend",
        "uni",
        "--kv-cache-memory-bytes",
        "67108864",
        "--kv-events-config",
        json.dumps(events),
        *extra_args,
    ]
    log = directory / "vllm.log"
    process = subprocess.Popen(
        argv,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=directory,
        start_new_session=True,
    )
    return VllmServer(
        process,
        f"http://127.0.0.1:{port}",
        port,
        f"tcp://127.0.0.1:{events_port}",
        f"tcp://127.0.0.1:{replay_port}",
        events_port,
        replay_port,
        log,
        directory,
    )


def wait_ready(server: VllmServer, timeout_s: float = 240.0) -> VllmServer:
    """Wait for /health; a server that dies or hangs fails with its log's tail."""
    started = time.monotonic()
    try:
        wait_http(server.url + "/health", timeout_s=timeout_s, process=server.process)
    except (RuntimeError, TimeoutError) as exc:
        server.stop()
        raise VllmUnavailable(
            f"vLLM did not start ({exc}); its log ends:\n" + server.output()[-4000:]
        ) from None
    server.ready_s = time.monotonic() - started  # type: ignore[attr-defined]
    return server


def restart(server: VllmServer, timeout_s: float = 240.0) -> VllmServer:
    """Stop a server and start a new process on the same ports and directory."""
    server.stop()
    model = Path(_argument(server.process.args, "--model"))  # type: ignore[arg-type]
    blocks = int(_argument(server.process.args, "--num-gpu-blocks-override"))  # type: ignore[arg-type]
    max_len = int(_argument(server.process.args, "--max-model-len"))  # type: ignore[arg-type]
    again = launch_vllm(
        server.directory,
        model,
        port=server.port,
        events_port=server.events_port,
        replay_port=server.replay_port,
        num_blocks=blocks,
        max_model_len=max_len,
    )
    return wait_ready(again, timeout_s)


def _argument(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]
