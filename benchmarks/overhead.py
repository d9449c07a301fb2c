"""What kvgate adds to a request: direct to a zero-cost simulated replica vs through the gateway.

One run, this machine: a `kvgate sim` with its timing model at zero, and `kvgate serve` in
front of it with recording ON into Postgres (and kv-aware routing, a tenant key, metrics).
The gateway is pinned alone to core 0; the replica and this load generator share core 1.
Concurrency 1 and 32, streaming and not: p50/p99 latency, requests/s, and the latency the
gateway adds. Afterwards every request the load generator saw complete must have its record.

With ``--spend-control``, one gateway serves two tenants in the same run: ``bench``, which
no rule names (spend control off), and ``governed``, with a budget (and, with ``both``, a
rate limit) never reached. Each scenario alternates blocks of the two (off, governed,
governed, off, ...), so the machine's drift falls on both alike, and prints the difference
in added p50 and the ratio of requests per second, spend control against off.
``--spend-control none`` puts no rule on either: what the comparison shows then is noise.

    .venv/bin/python benchmarks/overhead.py [--database-url postgresql://postgres@127.0.0.1:5432/test]
    .venv/bin/python benchmarks/overhead.py --endpoints   # chat, responses, messages, embeddings
    .venv/bin/python benchmarks/overhead.py --spend-control both   # off and governed, one run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.db.models import RequestRow
from gateway.db.session import normalise_url
from tests.factories import config_file
from tests.support.processes import (
    Proc,
    cli_tenant,
    free_port,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
)

MODEL = "kvgate/demo-llama-8b"
SYSTEM = "You are a terse assistant for the overhead benchmark. " * 6
ASK = "Say something short."
BODY = {
    "model": MODEL,
    "max_tokens": 16,
    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}],
}
# --endpoints: the same prompt on each wire the vLLM path serves (non-streaming).
ENDPOINTS: dict[str, dict[str, object]] = {
    "/v1/chat/completions": BODY,
    "/v1/responses": {
        "model": MODEL,
        "instructions": SYSTEM,
        "input": ASK,
        "max_output_tokens": 16,
    },
    "/v1/messages": {
        "model": MODEL,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": ASK}],
        "max_tokens": 16,
    },
    "/v1/embeddings": {"model": MODEL, "input": SYSTEM + ASK},
}


@dataclass
class Result:
    name: str
    latencies: list[float]
    seconds: float
    errors: int

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds

    def __add__(self, other: Result) -> Result:
        """Two blocks of one scenario as one."""
        return Result(
            self.name,
            self.latencies + other.latencies,
            self.seconds + other.seconds,
            self.errors + other.errors,
        )


async def run(
    url: str,
    key: str,
    *,
    stream: bool,
    concurrency: int,
    requests: int,
    request_ids: list[str],
    body: dict[str, object] = BODY,
) -> Result:
    body = dict(body, stream=True, stream_options={"include_usage": True}) if stream else body
    payload = orjson.dumps(body)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    latencies: list[float] = []
    errors = 0
    remaining = requests
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0:
                remaining -= 1
                start = time.perf_counter()
                async with session.post(url, data=payload, headers=headers) as reply:
                    data = await reply.read()
                    ok = reply.status == 200 and (not stream or data.endswith(b"data: [DONE]\n\n"))
                    if "x-request-id" in reply.headers and ok:
                        request_ids.append(reply.headers["x-request-id"])
                if ok:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors += 1

        for _ in range(warmups(requests)):  # warm-up: connections, caches
            async with session.post(url, data=payload, headers=headers) as reply:
                if "x-request-id" in reply.headers and reply.status == 200:
                    await reply.read()
                    request_ids.append(reply.headers["x-request-id"])
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return Result("", latencies, seconds, errors)


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """A fresh database on the Postgres server (its URL), dropped afterwards."""
    name = prefix + secrets.token_hex(4)
    admin = create_engine(normalise_url(server_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(normalise_url(server_url)).set(database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def own_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def flamegraph(pid: int, svg: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling the gateway (on core 1, beside the load) until sent SIGINT."""
    svg.parent.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    command = [str(spy), "record", "--pid", str(pid), "--rate", "200", "--format", "flamegraph"]
    process = subprocess.Popen([*command, "--output", str(svg)], stdout=subprocess.DEVNULL)
    pin(process.pid, 1)
    time.sleep(1.0)  # attached before the load starts
    return process


def pin(process_id: int, core: int) -> None:
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:  # type: ignore[operator]
        os.sched_setaffinity(process_id, {core})


CHECKED_AT_ONCE = 10_000  # request ids per look-up (Postgres takes at most 65,535 parameters)
BLOCKS = 10  # each tenant's share of a scenario, in this many alternating blocks


def alternate(
    gateway: Proc,
    path: str,
    stream: bool,
    concurrency: int,
    requests: int,
    body: dict[str, object],
    keys: tuple[str, str],
    request_ids: list[str],
) -> tuple[Result, float, Result, float, Paired]:
    """One scenario's requests, half from each key, in alternating blocks (off, governed,
    governed, off, ...): each key's merged result and gateway CPU milliseconds per request,
    and the medians over the block pairs (each pair run back to back, so in one state of
    the machine) of the governed block's p50 less the off block's, and of their req/s."""
    results: list[Result | None] = [None, None]
    cpu = [0.0, 0.0]
    p50_added: list[float] = []
    rps_ratio: list[float] = []
    for block in range(BLOCKS):
        pair: list[Result] = [Result("", [], 1.0, 0), Result("", [], 1.0, 0)]
        for which in (0, 1) if block % 2 == 0 else (1, 0):
            before = own_cpu(gateway.process.pid)
            result = asyncio.run(
                run(
                    gateway.url + path,
                    keys[which],
                    stream=stream,
                    concurrency=concurrency,
                    requests=requests // 2 // BLOCKS,
                    request_ids=request_ids,
                    body=body,
                )
            )
            # Its warm-up's requests counted too: the CPU is theirs as well.
            sent = len(result.latencies) + result.errors + warmups(requests // 2 // BLOCKS)
            cpu[which] += (own_cpu(gateway.process.pid) - before) * 1000 / sent / BLOCKS
            known = results[which]
            results[which] = result if known is None else known + result
            pair[which] = result
        if pair[0].latencies and pair[1].latencies:
            p50_added.append(pair[1].p50_ms - pair[0].p50_ms)
            rps_ratio.append(pair[1].rps / pair[0].rps)
    off, governed = results
    assert off is not None and governed is not None
    paired = Paired(
        statistics.median(p50_added) if p50_added else 0.0,
        statistics.median(rps_ratio) if rps_ratio else 1.0,
    )
    return off, cpu[0], governed, cpu[1], paired


@dataclass(frozen=True)
class Paired:
    """Medians over a scenario's block pairs: governed p50 less off (ms), req/s ratio."""

    p50_added_ms: float
    rps_ratio: float


def report_spend(
    compared: list[tuple[str, int, Result, Result, float, Result, float, Paired]],
    rules: str,
    width: int,
) -> None:
    """The off and governed tenants of each scenario side by side, from the same run."""
    print(
        f"\nspend control ({rules}) against off: one gateway worker pinned to core 0, "
        f"alternating blocks of each tenant's requests (CPU/req counts their warm-ups too)"
    )
    print(
        f"{'mode':<{width}}{'c':>4} | {'off added p50':>14}{'req/s':>8}{'CPU/req':>9} | "
        f"{'governed added p50':>19}{'req/s':>8}{'CPU/req':>9} | {'p50 +':>8} {'req/s':>7}"
        f" {'errors':>6} | {'pairs: p50 +':>12} {'req/s':>7}"
    )
    for mode, concurrency, direct, off, off_cpu, governed, governed_cpu, paired in compared:
        off_added = off.p50_ms - direct.p50_ms
        governed_added = governed.p50_ms - direct.p50_ms
        print(
            f"{mode:<{width}}{concurrency:>4} | {off_added:>12.3f}ms{off.rps:>8.0f}"
            f"{off_cpu:>7.3f}ms | {governed_added:>17.3f}ms{governed.rps:>8.0f}"
            f"{governed_cpu:>7.3f}ms | {governed_added - off_added:>+6.3f}ms "
            f"{100 * (governed.rps / off.rps - 1):>+6.1f}% "
            f"{direct.errors + off.errors + governed.errors:>6} | "
            f"{paired.p50_added_ms:>+10.3f}ms {100 * (paired.rps_ratio - 1):>+6.1f}%"
        )


def report(
    results: list[tuple[str, int, bool, Result, Result, float]], journal_sync: str, width: int
) -> None:
    """Each scenario direct and through the gateway."""
    print(
        f"\nkvgate overhead, one gateway worker pinned to core 0 (replica and load on core 1),"
        f" journal sync {journal_sync}"
    )
    print(
        f"{'mode':<{width}}{'c':>4} | {'direct p50':>11}{'p99':>9}{'req/s':>9} | "
        f"{'kvgate p50':>11}{'p99':>9}{'req/s':>9} | {'added p50':>10} "
        f"{'CPU/req':>8} {'errors':>6}"
    )
    for mode, concurrency, _stream, direct, through, cpu_ms in results:
        print(
            f"{mode:<{width}}{concurrency:>4} | {direct.p50_ms:>9.2f}ms{direct.p99_ms:>7.2f}ms"
            f"{direct.rps:>9.0f} | {through.p50_ms:>9.2f}ms{through.p99_ms:>7.2f}ms"
            f"{through.rps:>9.0f} | {through.p50_ms - direct.p50_ms:>8.2f}ms "
            f"{cpu_ms:>6.2f}ms {direct.errors + through.errors:>6}"
        )


def warmups(requests: int) -> int:
    """How many requests ``run`` sends before it starts timing."""
    return min(200, requests // 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="a Postgres server; a fresh database is created in it and dropped",
    )
    parser.add_argument("--requests", type=int, default=3000, help="requests per scenario")
    parser.add_argument(
        "--journal-sync",
        choices=("background", "always", "never"),
        default="background",
        help="KVGATE_JOURNAL_SYNC: flush after the response (default), before it, or never",
    )
    parser.add_argument(
        "--flamegraph",
        type=Path,
        default=None,
        metavar="DIR",
        help="also record py-spy flame graphs (SVG) of the gateway in the c=32 scenarios",
    )
    parser.add_argument(
        "--spend-control",
        choices=("budget", "both", "none"),
        default=None,
        help="a second tenant beside the benchmark's, with a budget (never reached), admitted "
        "from the worker's lease; both: a rate limit (never reached) too, admitted from the "
        "worker's leases of its minute; none: no rule on either (the comparison's noise floor)",
    )
    parser.add_argument(
        "--endpoints",
        action="store_true",
        help="instead: each endpoint of the vLLM path (chat, responses, messages, embeddings), "
        "non-streaming, c=1 and c=32, so their added p50 can be set beside chat's",
    )
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvgate-overhead-"))
    scratch = contextlib.ExitStack()
    database_url = scratch.enter_context(scratch_database(args.database_url, "kvgate_bench_"))
    sim = gateway = None
    try:
        env = gateway_env(
            database_url,
            tmp / "journal",
            KVGATE_LOG_LEVEL="error",
            KVGATE_RECORDER_FLUSH_INTERVAL_S="0.2",
            KVGATE_KEY_REFRESH_S="5",
            KVGATE_PRICE_REFRESH_S="30",
            KVGATE_JOURNAL_SYNC=args.journal_sync,
        )
        kvgate("db", "upgrade", env=env)
        kvgate("prices", "sync", env=env)
        key, _ = cli_tenant(env, "bench")
        governed = cli_tenant(env, "governed")[0] if args.spend_control else None
        if args.spend_control in ("budget", "both"):
            kvgate(
                "budgets",
                "set",
                "--scope",
                "tenant:governed",
                "--limit",
                "1000000",
                "--period",
                "month",
                env=env,
            )
        if args.spend_control == "both":
            kvgate(
                "limits",
                "set",
                "--scope",
                "tenant:governed",
                "--requests-per-minute",
                "100000000",
                "--tokens-per-minute",
                "100000000000",
                env=env,
            )
        sim = start_sim(
            tmp,
            extra=(
                "--prefill-tokens-per-s",
                "0",
                "--decode-tokens-per-s",
                "0",
                "--max-num-seqs",
                "100000",
                "--capacity-blocks",
                "100000",
            ),
        )
        config = config_file(
            tmp / "kvgate.yaml", [{"name": MODEL, "replicas": [sim.url], "policy": "kv-aware"}]
        )
        gateway = start_gateway(tmp, config, env, port=free_port())
        pin(gateway.process.pid, 0)
        pin(sim.process.pid, 1)
        pin(0, 1)
        results: list[tuple[str, int, bool, Result, Result, float]] = []
        compared: list[tuple[str, int, Result, Result, float, Result, float, Paired]] = []
        gateway_ids: list[str] = []
        scenarios: list[tuple[str, bool, dict[str, object]]] = (
            [(path, False, body) for path, body in ENDPOINTS.items()]
            if args.endpoints
            else [("/v1/chat/completions", stream, BODY) for stream in (False, True)]
        )
        for path, stream, body in scenarios:
            for concurrency in (1, 32):
                n = args.requests if concurrency == 1 else args.requests * 2
                # The scenario's load, to a URL with a key (its request ids kept in a list).
                load = functools.partial(
                    run, stream=stream, concurrency=concurrency, requests=n, body=body
                )
                direct = asyncio.run(load(sim.url + path, key, request_ids=[]))
                own_before = own_cpu(gateway.process.pid)
                mode = (
                    path.removeprefix("/v1/")
                    if args.endpoints
                    else ("stream" if stream else "json")
                )
                profiler = (
                    flamegraph(
                        gateway.process.pid,
                        args.flamegraph / f"overhead-{mode.replace('/', '-')}-c32.svg",
                    )
                    if args.flamegraph is not None and concurrency == 32
                    else None
                )
                if governed is not None:
                    both = alternate(
                        gateway, path, stream, concurrency, n, body, (key, governed), gateway_ids
                    )
                    compared.append((mode, concurrency, direct, *both))
                else:
                    through = asyncio.run(load(gateway.url + path, key, request_ids=gateway_ids))
                    # The gateway process alone (its writer child is reported apart).
                    cpu_ms = (
                        (own_cpu(gateway.process.pid) - own_before) * 1000 / len(through.latencies)
                    )
                    results.append((mode, concurrency, stream, direct, through, cpu_ms))
                if profiler is not None:
                    profiler.send_signal(signal.SIGINT)  # py-spy writes the SVG on SIGINT
                    profiler.wait(timeout=60)
        engine = create_engine(normalise_url(database_url))
        deadline = time.monotonic() + 60
        recorded = 0
        while time.monotonic() < deadline:
            with engine.connect() as connection:
                recorded = connection.scalar(select(func.count()).select_from(RequestRow)) or 0
            if recorded >= len(gateway_ids):
                break
            time.sleep(0.5)
        sent = sorted(set(gateway_ids))
        found = 0
        with engine.connect() as connection:
            for start in range(0, len(sent), CHECKED_AT_ONCE):  # a statement's parameters
                chunk = sent[start : start + CHECKED_AT_ONCE]
                found += (
                    connection.scalar(select(func.count()).where(RequestRow.request_id.in_(chunk)))
                    or 0
                )
        missing = len(sent) - found
        engine.dispose()

        width = max(7, *(len(name) + 1 for name, *_ in results), *(len(c[0]) + 1 for c in compared))
        if results:
            report(results, args.journal_sync, width)
        if compared:
            report_spend(compared, args.spend_control or "", width)
        print(
            f"\nrequests through kvgate: {len(gateway_ids)}, records in Postgres: {recorded}, "
            f"completed requests without a record: {missing}"
        )
    finally:
        if gateway:
            gateway.stop()
        if sim:
            sim.stop()
        scratch.close()


if __name__ == "__main__":
    main()
