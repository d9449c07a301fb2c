"""Gateway start to ready: `kvgate serve` launched, until /healthz answers 200.

Three simulated replicas behind kv-aware routing, no litellm deployment, the embedded
SQLite database (or --database-url). Each run starts a fresh `kvgate serve` process and
polls /healthz every 5 ms; it also reports when the database writer (a child process) has
made its first pass (`recorder_ready`), which serving does not wait for: records are
journaled meanwhile.

    .venv/bin/python benchmarks/startup.py [--runs 7] [--database-url URL]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.factories import config_file
from tests.support.processes import free_port, gateway_env, kvgate, start_sim

MODEL = "kvgate/demo-llama-8b"


def health(url: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as reply:
            return orjson.loads(reply.read())  # type: ignore[no-any-return]
    except OSError:
        return None


def one_start(config: Path, env: dict[str, str], log: Path) -> tuple[float, float]:
    """Seconds to /healthz 200, and to the writer's first pass."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)]
    started = time.perf_counter()
    process = subprocess.Popen(
        [*command, "--port", str(port)], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
    try:
        ready = writer = None
        while writer is None and time.perf_counter() - started < 60:
            status = health(url)
            now = time.perf_counter() - started
            if status is not None and ready is None:
                ready = now
            if status is not None and status.get("recorder_ready"):
                writer = now
            time.sleep(0.005)
        if ready is None or writer is None:
            raise RuntimeError(f"the gateway did not become ready; see {log}")
        return ready, writer
    finally:
        process.terminate()
        process.wait(timeout=20)


def import_seconds() -> float:
    """A fresh interpreter importing the app factory (what every start pays first)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import gateway.app, gateway.cli"], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvgate-startup-"))
    database_url = args.database_url or f"sqlite:///{tmp / 'kvgate.db'}"
    env = gateway_env(database_url, tmp / "journal", KVGATE_LOG_LEVEL="warning")
    kvgate("db", "upgrade", env=env)
    kvgate("prices", "sync", env=env)
    sims = [start_sim(tmp) for _ in range(3)]
    try:
        config = config_file(
            tmp / "kvgate.yaml",
            [{"name": MODEL, "replicas": [s.url for s in sims], "policy": "kv-aware"}],
        )
        one_start(config, env, tmp / "gateway.log")  # warm the OS page cache
        runs = [one_start(config, env, tmp / "gateway.log") for _ in range(args.runs)]
        imports = [import_seconds() for _ in range(3)]
    finally:
        for sim in sims:
            sim.stop()
    ready = [r for r, _ in runs]
    writer = [w for _, w in runs]
    print(f"kvgate serve, 3 sim replicas, kv-aware, {database_url.split(':')[0]}, {args.runs} runs")
    print(
        f"start to /healthz 200: median {statistics.median(ready):.3f} s"
        f" (min {min(ready):.3f}, max {max(ready):.3f})"
    )
    print(
        f"start to writer ready: median {statistics.median(writer):.3f} s"
        f" (min {min(writer):.3f}, max {max(writer):.3f})"
    )
    print(f"python -c 'import gateway.app, gateway.cli': median {statistics.median(imports):.3f} s")


if __name__ == "__main__":
    main()
