"""Normal clients' latency with and without thousands of slow connections held open.

One run, this machine: `kvgate serve` in front of an instant `kvgate sim`. The normal load
(chat completions from a separate process, at a fixed concurrency) runs alone, then while
this process holds ``--slow`` connections that never finish their request (a head
trickled a byte every half second, a head of 30 KiB left unterminated, a body shorter than
its Content-Length), opening a new one whenever the gateway cuts one, so that all of them
stay open for the whole phase; ``--rounds`` times, alternately, so that the machine's
drift falls on both alike. Prints each phase's p50/p99, both conditions' over all rounds
and their ratio (with against alone), how many slow connections the gateway cut and how,
and the gateway's memory.

    .venv/bin/python benchmarks/slow_clients.py [--slow 2000] [--seconds 25] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import own_cpu
from benchmarks.sidebyside import GATEWAY_CORE, LOAD_CORE, on_core
from tests.faults.conftest import MODEL, make_stack
from tests.faults.probes import rss_kib

BODY = json.dumps(
    {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hello there"}]}
).encode()

LOAD = """
import asyncio, json, sys, time
import aiohttp
url, key = sys.argv[1:3]
seconds, concurrency, rate = float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
body = sys.stdin.buffer.read()
latencies, errors = [], 0
headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
path = url + "/v1/chat/completions"
async def one(session, since):
    global errors
    async with session.post(path, data=body, headers=headers) as r:
        await r.read()
        if r.status != 200:
            errors += 1
    latencies.append(time.perf_counter() - since)
async def closed(session):
    until = time.perf_counter() + seconds
    async def client():
        while time.perf_counter() < until:
            await one(session, time.perf_counter())
    await asyncio.gather(*(client() for _ in range(concurrency)))
async def opened(session):
    # Open loop: request i is due at start + i / rate, sent then whatever came back, and
    # timed from when it was due (a stall delays the requests behind it: they count it).
    start, sent, tasks = time.perf_counter(), 0, []
    while sent < seconds * rate:
        due = start + sent / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(session, due)))
        sent += 1
    await asyncio.gather(*tasks)
async def main():
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await (opened(session) if rate > 0 else closed(session))
asyncio.run(main())
print(json.dumps({"latencies": latencies, "errors": errors}))
"""


def normal_load(
    url: str, key: str, seconds: float, concurrency: int, rate: float = 0.0
) -> tuple[list[float], int]:
    """The normal clients, in their own process (so this one's slow connections cost them
    nothing on the client side): ``concurrency`` back to back, or with ``rate`` that many
    requests a second whatever the answers' pace."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD, url, key, str(seconds), str(concurrency), str(rate)],
        input=BODY,
        capture_output=True,
        check=True,
        preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, 0),  # not the holder's nice
    )
    result = json.loads(done.stdout)
    return result["latencies"], result["errors"]


def head(key: str, extra: str) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\n{extra}"
    ).encode()


async def hold(
    host: str, port: int, key: str, kind: int, stop: asyncio.Event, cut: Counter[str]
) -> None:
    """One slow connection, opened again each time the gateway cuts it, until ``stop``."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            cut["connect failed"] += 1
            await asyncio.sleep(0.5)
            continue
        if kind == 0:
            data = head(key, "X-Slowly: " + "a" * 200)
            writer.write(data[:1])
        elif kind == 1:
            writer.write(head(key, "X-Big: " + "a" * (30 * 1024)))
        else:
            writer.write(head(key, "Content-Length: 1000\r\n\r\n") + b'{"model": ')
        read = asyncio.ensure_future(reader.read(64))
        sent = 1
        while not read.done() and not stop.is_set():
            await asyncio.wait([read], timeout=0.5)
            if kind == 0 and not read.done() and sent < len(data):
                writer.write(data[sent : sent + 1])
                sent += 1
        if read.done():
            try:
                answer = read.result()
            except ConnectionError:
                answer = b"reset"
            cut[answer[:12].decode(errors="replace") or "closed"] += 1
        else:
            read.cancel()
        writer.close()


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """p50 and p99, in milliseconds."""
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000


def figures(name: str, latencies: list[float], errors: int) -> str:
    p50, p99 = percentiles(latencies)
    return (
        f"{name:<40} {len(latencies):>6} req  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  errors {errors}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=2000, help="slow connections held open")
    parser.add_argument(
        "--seconds",
        type=float,
        default=25.0,
        help="each phase's length: two header timeouts (10 s by default) and more, so that"
        " the gateway cuts every slow connection at least twice meanwhile",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="normal clients at once")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="normal requests a second, sent open loop whatever the answers' pace (0: the"
        " --concurrency clients back to back, which keeps the gateway's core saturated)",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="alone, then with them, this many times"
    )
    parser.add_argument(
        "--holder-nice",
        type=int,
        default=0,
        help="the nice value this script holds the slow connections at (the normal load"
        " and the sim stay at 0): on a machine of two cores the holder shares a core with"
        " them, and its own bursts of work (reading thousands of answers at once and"
        " opening as many connections again) delay them, where an attacker would not be"
        " on the gateway's machine; 19 to keep it off their share of the core",
    )
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave the gateway on any core (by default it has core 0 to itself, and the"
        " sim, the normal load and this script's slow connections share core 1, as a"
        " gateway and its attackers would not share a machine)",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.holder_nice < 0 or (args.holder_nice and os.geteuid() != 0):
        parser.error("--holder-nice: 0 to 19, and above 0 as root (the load is put back at 0)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.slow + 1024)), hard))

    phases: list[tuple[str, list[float], int]] = []
    cut: Counter[str] = Counter()
    held_s = 0.0
    cpu = {"alone": 0.0, "with": 0.0, "holder": 0.0}  # CPU seconds
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        pin = args.pin and len(os.sched_getaffinity(0)) > 1
        if pin:
            os.sched_setaffinity(0, {LOAD_CORE})  # inherited by all this starts...
        stack = make_stack(tmp, f"sqlite:///{tmp / 'kvgate.db'}", replicas=1, start=False)
        try:
            with on_core(GATEWAY_CORE) if pin else contextlib.nullcontext():
                stack.start_gateway()  # ...but the gateway, its threads and children
            assert stack.gateway is not None
            pid = stack.gateway.process.pid
            host, port = stack.url.removeprefix("http://").split(":")
            load = functools.partial(
                normal_load, stack.url, stack.key, args.seconds, args.concurrency, args.rate
            )
            normal_load(stack.url, stack.key, 1.0, args.concurrency)  # warm-up
            rss_before = rss_kib(pid)

            async def under_siege() -> tuple[tuple[list[float], int], int]:
                os.setpriority(os.PRIO_PROCESS, 0, args.holder_nice)  # this thread only
                stop = asyncio.Event()
                slow = [
                    asyncio.ensure_future(hold(host, int(port), stack.key, i % 3, stop, cut))
                    for i in range(args.slow)
                ]
                await asyncio.sleep(3)  # all open
                rss_held = rss_kib(pid)
                loaded = await asyncio.to_thread(load)
                stop.set()
                await asyncio.gather(*slow)
                os.setpriority(os.PRIO_PROCESS, 0, 0)  # the next round's start and load
                return loaded, rss_held

            for number in range(1, args.rounds + 1):
                before = own_cpu(pid)
                alone = load()
                cpu["alone"] += own_cpu(pid) - before
                phases.append((f"alone ({number})", *alone))
                started, before, mine = time.monotonic(), own_cpu(pid), time.process_time()
                loaded, rss_held = asyncio.run(under_siege())
                held_s += time.monotonic() - started
                cpu["with"] += own_cpu(pid) - before
                cpu["holder"] += time.process_time() - mine
                phases.append((f"with {args.slow} slow connections ({number})", *loaded))
        finally:
            stack.close()

    clients = f"{args.rate:g} requests/s open loop" if args.rate else f"{args.concurrency} clients"
    where = "the gateway alone on core 0" if pin else "no cores pinned"
    print(
        f"kvgate serve, an instant sim, normal load {clients}, alternately; {where}; the"
        f" slow connections held at nice {args.holder_nice}"
    )
    for name, latencies, errors in phases:
        print(figures(name, latencies, errors))
    merged = {
        kind: (
            [x for name, latencies, _ in phases if name.startswith(kind) for x in latencies],
            sum(errors for name, _, errors in phases if name.startswith(kind)),
        )
        for kind in ("alone", "with")
    }
    print(figures("alone, all rounds", *merged["alone"]))
    print(figures(f"with {args.slow} slow connections, all rounds", *merged["with"]))
    (alone_p50, alone_p99), (with_p50, with_p99) = (
        percentiles(merged[kind][0]) for kind in ("alone", "with")
    )
    print(
        f"with them against alone: p50 {with_p50 / alone_p50:.2f}x, p99 "
        f"{with_p99 / alone_p99:.2f}x (p99 {with_p99 - alone_p99:+.2f} ms)"
    )
    if args.rounds > 1:  # the noise floor: the same condition, odd rounds against even ones
        alones = [latencies for name, latencies, _ in phases if name.startswith("alone")]
        odd, even = (
            percentiles([x for lat in alones[parity::2] for x in lat]) for parity in (0, 1)
        )
        print(f"alone against alone (odd rounds / even): p99 {odd[1] / even[1]:.2f}x")
    print(
        "gateway CPU per normal request (the slow connections' share included): alone "
        f"{cpu['alone'] * 1000 / len(merged['alone'][0]):.3f} ms, with them "
        f"{cpu['with'] * 1000 / len(merged['with'][0]):.3f} ms; this script's own CPU "
        f"while it held them (on the same cores): {cpu['holder']:.1f} s of {held_s:.1f} s"
    )
    print(
        f"slow connections held for {held_s:.1f} s; the gateway's answers to them: "
        + (", ".join(f"{answer!r} {n}" for answer, n in cut.most_common()) or "none yet")
    )
    print(f"gateway RSS {rss_before / 1024:.1f} MiB alone, {rss_held / 1024:.1f} MiB with them")


if __name__ == "__main__":
    main()
