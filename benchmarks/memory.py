"""Gateway memory under a long load: resident size after N requests against after 10,000.

The setup of overhead.py (a zero-cost `kvgate sim`, `kvgate serve` with recording into
Postgres, kv-aware routing, a tenant key; the gateway pinned to core 0), driven at
concurrency 32 with a mix of streaming and non-streaming requests, in chunks; after each
chunk it reads VmRSS of the gateway process and of its database writer (a child process).
Every request that completed must have its record at the end.

    .venv/bin/python benchmarks/memory.py [--requests 1000000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import pin, run, scratch_database

from gateway.db.models import RequestRow
from gateway.db.session import normalise_url
from tests.factories import config_file
from tests.support.processes import (
    cli_tenant,
    free_port,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
)

MODEL = "kvgate/demo-llama-8b"
FIRST = 10_000


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def writer_pid(gateway: int) -> int:
    """The database writer: the gateway's child started by multiprocessing's spawn."""
    for task in Path(f"/proc/{gateway}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    raise RuntimeError("the gateway has no database writer process")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--chunks", type=int, default=10, help="RSS readings after the first")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvgate-memory-"))
    scratch = contextlib.ExitStack()
    database_url = scratch.enter_context(scratch_database(args.database_url, "kvgate_mem_"))
    sim = gateway = None
    try:
        env = gateway_env(database_url, tmp / "journal", KVGATE_LOG_LEVEL="error")
        env.update(KVGATE_RECORDER_FLUSH_INTERVAL_S="0.2", KVGATE_KEY_REFRESH_S="5")
        kvgate("db", "upgrade", env=env)
        kvgate("prices", "sync", env=env)
        key, _ = cli_tenant(env, "memory")
        zero = ("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "0")
        sim = start_sim(tmp, extra=(*zero, "--max-num-seqs", "100000"))
        config = config_file(
            tmp / "kvgate.yaml", [{"name": MODEL, "replicas": [sim.url], "policy": "kv-aware"}]
        )
        gateway = start_gateway(tmp, config, env, port=free_port())
        pin(gateway.process.pid, 0)
        pin(sim.process.pid, 1)
        pin(0, 1)
        writer = writer_pid(gateway.process.pid)
        ids: list[str] = []
        done = 0
        readings: list[tuple[int, float, float, float]] = []
        started = time.perf_counter()
        targets = [FIRST] + [
            FIRST + (args.requests - FIRST) * (i + 1) // args.chunks for i in range(args.chunks)
        ]
        for target in targets:
            n = target - done
            half = n // 2
            for stream, count in ((False, half), (True, n - half)):
                url = gateway.url + "/v1/chat/completions"
                asyncio.run(
                    run(url, key, stream=stream, concurrency=32, requests=count, request_ids=ids)
                )
            done = target
            readings.append(
                (
                    done,
                    rss_mib(gateway.process.pid),
                    rss_mib(writer),
                    time.perf_counter() - started,
                )
            )
            print(
                f"{done:>9,} requests  gateway RSS {readings[-1][1]:7.1f} MiB"
                f"  writer RSS {readings[-1][2]:7.1f} MiB  ({readings[-1][3]:.0f} s)",
                flush=True,
            )
        engine = create_engine(normalise_url(database_url))
        deadline = time.monotonic() + 120
        recorded = 0
        while time.monotonic() < deadline and recorded < len(set(ids)):
            with engine.connect() as connection:
                recorded = connection.scalar(select(func.count()).select_from(RequestRow)) or 0
            time.sleep(0.5)
        engine.dispose()
        first, last = readings[0], readings[-1]
        print(
            f"\ngateway RSS after {last[0]:,} requests: {last[1]:.1f} MiB, after {first[0]:,}:"
            f" {first[1]:.1f} MiB ({(last[1] / first[1] - 1) * 100:+.1f}%);"
            f" writer {first[2]:.1f} -> {last[2]:.1f} MiB"
        )
        print(f"completed requests: {len(set(ids)):,}, records in Postgres: {recorded:,}")
    finally:
        for proc in (gateway, sim):
            if proc is not None:
                proc.stop()
        scratch.close()


if __name__ == "__main__":
    main()
