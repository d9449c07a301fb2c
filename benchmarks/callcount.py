"""Python calls per request on the gateway's serving thread: a count, not a time.

Timings on a shared 2-core machine move by more than a small change to the request path
is worth, so this counts instead. The gateway runs as `kvgate serve` does, on the same
nginx upstream, scratch Postgres database, tenant key and kv-aware pool as
benchmarks/sidebyside.py; a wrapper enables cProfile on its main thread (the event loop)
for exactly N requests of one kind, after a warm-up, and dumps the profile. The figure is
the number of Python-level function calls (cProfile's count, C functions included) per
request, with the functions that make most of them. The database writer runs in its own
process and is not counted; the journal's flush thread neither.

    .venv/bin/python benchmarks/callcount.py [--requests 500] [--tree DIR] [--top 25]
        [--spend-control both]

`--spend-control both` puts a month's budget and a rate limit (neither ever reached, as
`benchmarks/overhead.py --spend-control both` does) on the benchmark's tenant: what
spend control adds to each request, counted.

`--tree DIR` runs the gateway from another checkout (a `git worktree` of an older
commit), so two commits are compared by the same driver, upstream and requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import JSON_MODEL, SSE_MODEL, request_body
from benchmarks.overhead import scratch_database
from benchmarks.sidebyside import PRICE_MODEL, bench_tenant, start_nginx
from tests.factories import config_file
from tests.support.processes import (
    free_port,
    kvgate,
    wait_http,
    wait_ready_to_record,
)

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"


async def send(url: str, key: str, *, stream: bool, count: int) -> None:
    """``count`` requests one after another, each read to its end."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = request_body(SSE_MODEL if stream else JSON_MODEL, stream=stream)
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                await r.read()
                assert r.status == 200, r.status


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of every thread of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_request(pid: int, url: str, key: str, *, stream: bool, n: int) -> float:
    """The gateway process's CPU time per request (ms) over ``n`` requests, unprofiled."""
    before = cpu_seconds(pid)
    asyncio.run(send(url, key, stream=stream, count=n))
    time.sleep(0.3)  # what the requests left for the loop's next turns (metrics, journal)
    return (cpu_seconds(pid) - before) * 1000 / n


def counted(
    process: subprocess.Popen[bytes], out: Path, url: str, key: str, *, stream: bool, n: int
) -> pstats.Stats:
    """The profile of exactly ``n`` requests of one kind (after a warm-up of as many)."""
    asyncio.run(send(url, key, stream=stream, count=n))
    time.sleep(0.5)  # the warm-up's records written, so the profile holds only the requests'
    process.send_signal(signal.SIGUSR1)
    time.sleep(0.2)
    asyncio.run(send(url, key, stream=stream, count=n))
    time.sleep(0.2)  # metrics observed on the loop's next turn belong to the requests
    out.unlink(missing_ok=True)
    process.send_signal(signal.SIGUSR2)
    for _ in range(100):
        if out.exists() and out.stat().st_size:
            break
        time.sleep(0.05)
    time.sleep(0.2)
    return pstats.Stats(str(out))


def report(name: str, stats: pstats.Stats, n: int, top: int) -> None:
    """Calls per request, and the functions that make most of them."""
    table = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[1] for entry in table.values())
    print(f"\n{name}: {total / n:,.0f} calls per request ({total:,} over {n} requests)")
    rows = sorted(table.items(), key=lambda item: item[1][1], reverse=True)[:top]
    for (path, line, function), entry in rows:
        where = path.split("site-packages/")[-1].replace(str(ROOT) + "/", "")
        print(f"  {entry[1] / n:8.2f}  {function}  {where}:{line}")


def main() -> None:
    """Count the calls per JSON and per streamed chat request."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="requests counted per kind")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout the gateway runs")
    parser.add_argument("--top", type=int, default=25, help="functions listed per kind")
    parser.add_argument("--cpu-requests", type=int, default=2000, help="requests per CPU round")
    parser.add_argument("--cpu-rounds", type=int, default=3, help="CPU rounds per kind")
    parser.add_argument("--save", type=Path, help="keep the profiles here (json.prof, ...)")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--spend-control",
        choices=("none", "both"),
        default="none",
        help="both: a budget and a rate limit on the tenant, never reached",
    )
    args = parser.parse_args()
    tree = args.tree.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-callcount-"))
    json_ports, sse_ports = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    with contextlib.ExitStack() as stack:
        nginx = start_nginx(tmp, json_ports, sse_ports)
        stack.callback(nginx.stop)
        database_url = stack.enter_context(scratch_database(args.database_url, "kvgate_calls_"))
        env, key = bench_tenant(database_url, tmp, PYTHONPATH=str(tree))
        if args.spend_control == "both":
            budget = ("--scope", "tenant:bench", "--limit", "1000000", "--period", "month")
            kvgate("budgets", "set", *budget, env=env)
            rates = ("--requests-per-minute", "100000000", "--tokens-per-minute", "100000000000")
            kvgate("limits", "set", "--scope", "tenant:bench", *rates, env=env)
        models = [
            {"name": name, "replicas": urls, "policy": "kv-aware", "price_model": PRICE_MODEL}
            for name, urls in (
                (JSON_MODEL, [f"http://127.0.0.1:{p}" for p in json_ports]),
                (SSE_MODEL, [f"http://127.0.0.1:{p}" for p in sse_ports]),
            )
        ]
        config = config_file(tmp / "kvgate.yaml", models)
        port, out = free_port(), tmp / "profile.out"
        command = [sys.executable, str(HERE / "profiled.py"), str(out)]
        command += ["serve", "--config", str(config), "--port", str(port)]
        log = tmp / "gateway.log"
        process = subprocess.Popen(
            command, cwd=tree, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        stack.callback(lambda: (process.terminate(), process.wait(timeout=30)))
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", process=process)
        wait_ready_to_record(url)
        print(f"gateway from {tree}, {args.requests} requests counted per kind")
        for name, stream in (("json", False), ("stream", True)):
            stats = counted(process, out, url, key, stream=stream, n=args.requests)
            report(name, stats, args.requests, args.top)
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                stats.dump_stats(args.save / f"{name}.prof")
        for name, stream in (("json", False), ("stream", True)) * args.cpu_rounds:
            cpu = cpu_per_request(process.pid, url, key, stream=stream, n=args.cpu_requests)
            print(f"cpu {name}: {cpu:.3f} ms per request over {args.cpu_requests} (unprofiled)")


if __name__ == "__main__":
    main()
