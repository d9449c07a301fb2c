"""kvgate with one worker on one core against two workers on two cores, in one run.

The setup of sidebyside.py (nginx answering fixed chat completions with usage, three
replica URLs, kv-aware routing, recording into a scratch Postgres database, a tenant key,
metrics), driven by wrk with non-streaming requests at concurrency 32 and 64:

- one worker: `kvgate serve` and everything it starts (its database writer included)
  on core 0; nginx and wrk on core 1.
- two workers: `kvgate serve --workers 2` on both cores; nginx and wrk share them, since
  this machine has no third core. Their CPU is measured and reported, so the gateway's
  own share can be told apart.

For each run it reads the CPU time of the gateway's whole process tree (workers, their
writers, the supervisor) from /proc, and reports it per request: near-linear scaling is
the same CPU per request with two workers as with one, and twice the requests per second
where the cores are the gateway's alone. Every request answered 200 must have its record.

    .venv/bin/python benchmarks/workers.py [--duration 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import JSON_MODEL, SSE_MODEL, Figures, Target, wrk
from benchmarks.overhead import scratch_database
from benchmarks.sidebyside import PRICE_MODEL, check_records, start_nginx
from tests.factories import config_file
from tests.support.processes import cli_tenant, free_port, gateway_env, kvgate, start_gateway

TICKS = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """A process and all its descendants."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                pending += [int(c) for c in (task / "children").read_text().split()]
    return found


def busy_cores() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


@dataclass
class Row:
    label: str
    concurrency: int
    figures: Figures
    cpu_ms_per_request: float  # the gateway's whole process tree
    gateway_cores: float  # CPU seconds per second of the gateway's tree
    nginx_cores: float
    wrk_cores: float
    machine_cores: float  # every process's, Postgres's included

    @property
    def per_core(self) -> float:
        return self.figures.rps / self.gateway_cores


def run(
    label: str, workers: int, cores: set[int], load_cores: set[int], args: argparse.Namespace
) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix=f"kvgate-workers-{workers}-"))
    os.sched_setaffinity(0, load_cores)
    json_ports, sse_ports = [free_port() for _ in range(3)], [free_port()]
    rows = []
    with contextlib.ExitStack() as stack:
        nginx = start_nginx(tmp, json_ports, sse_ports)
        stack.callback(nginx.stop)
        database_url = stack.enter_context(scratch_database(args.database_url, "kvgate_wk_"))
        env = gateway_env(
            database_url,
            tmp / "journal",
            KVGATE_LOG_LEVEL="error",
            KVGATE_KEY_REFRESH_S="5",
            KVGATE_PRICE_REFRESH_S="30",
        )
        kvgate("db", "upgrade", env=env)
        kvgate("prices", "sync", env=env)
        key, _ = cli_tenant(env, "bench")
        urls = [f"http://127.0.0.1:{p}" for p in json_ports]
        config = config_file(
            tmp / "kvgate.yaml",
            [
                {
                    "name": JSON_MODEL,
                    "replicas": urls,
                    "policy": "kv-aware",
                    "price_model": PRICE_MODEL,
                },
                {
                    "name": SSE_MODEL,
                    "replicas": [f"http://127.0.0.1:{sse_ports[0]}"],
                    "price_model": PRICE_MODEL,
                },
            ],
        )
        os.sched_setaffinity(0, cores)
        gateway = start_gateway(
            tmp, config, env, port=free_port(), args=("--workers", str(workers))
        )
        os.sched_setaffinity(0, load_cores)
        stack.callback(gateway.stop)
        target = Target(label, gateway.url, key)
        answered = wrk(target, tmp, stream=False, concurrency=32, seconds=2).ok  # warm-up
        for concurrency in (32, 64):
            pids = tree(gateway.process.pid)
            helpers = [nginx.process.pid, *tree(nginx.process.pid)[1:]]
            before, helpers_before = cpu_seconds(pids), cpu_seconds(helpers)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            busy_before, all_before = busy_cores()
            started = time.monotonic()
            figures = wrk(target, tmp, stream=False, concurrency=concurrency, seconds=args.duration)
            wall = time.monotonic() - started
            gateway_cpu = cpu_seconds(pids) - before
            nginx_cpu = cpu_seconds(helpers) - helpers_before
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            wrk_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
            busy_after, all_after = busy_cores()
            machine = (busy_after - busy_before) / (all_after - all_before) * os.cpu_count()
            answered += figures.ok
            rows.append(
                Row(
                    label,
                    concurrency,
                    figures,
                    gateway_cpu * 1000 / max(figures.ok, 1),
                    gateway_cpu / wall,
                    nginx_cpu / wall,
                    wrk_cpu / wall,
                    machine,
                )
            )
        time.sleep(3)  # every worker's writer drains its journal
        records = check_records(database_url, answered)
        print(f"{label}: {records}")
    shutil.rmtree(tmp, ignore_errors=True)
    if records["missing"]:
        sys.exit(f"{label}: some requests answered 200 have no complete record")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--duration", type=int, default=10, help="seconds per scenario")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two cores")
    rows = run("1 worker, core 0", 1, {0}, {1}, args)
    rows += run("2 workers, cores 0-1", 2, {0, 1}, {0, 1}, args)
    print(
        "\nworkers | c | req/s | p50 ms | p99 ms | gateway CPU ms/req | cores busy: gateway"
        " / wrk / nginx / whole machine | req/s per gateway core"
    )
    for row in rows:
        f = row.figures
        print(
            f"{row.label} | {row.concurrency} | {f.rps:,.0f} | {f.p50_ms:.2f} | {f.p99_ms:.2f} |"
            f" {row.cpu_ms_per_request:.3f} | {row.gateway_cores:.2f} / {row.wrk_cores:.2f} /"
            f" {row.nginx_cores:.2f} / {row.machine_cores:.2f} | {row.per_core:,.0f}"
        )


if __name__ == "__main__":
    main()
