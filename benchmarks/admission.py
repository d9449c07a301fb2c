"""What admission costs one request, in the gateway's own CPU time: a tenant no rule names,
one with a budget, one with a budget and a rate limit (requests and tokens per minute).

Steady state: the worker holds its slices (taken by a warm-up), so admission and
settlement run in memory; the statements the database ran while measuring are counted
(none expected). Time is ``time.thread_time``: this thread's CPU only, so other work on
a shared machine does not count in it. The scenarios take turns in blocks of ``BLOCK``
requests, and each is also given against the no-rule one of the same rounds: this host's
speed swings by two for seconds at a time, which the microseconds show and the ratio does
not. SQLite in a temporary directory.

Then what the worker pays off the request path, with a budget and a rate limit (three
counters), on SQLite and, with ``--database-url``, on a scratch database of that Postgres
server: the CPU of one flush that writes spend to all three counters, and the statements it
runs; and, for a worker kept busy at ``--rate`` requests a second for ``--seconds``, ticking
every ``FLUSH_S`` as the gateway does, what its ticks cost per second of serving (CPU
milliseconds: thousandths of a core) and the transactions and statements they run.

    .venv/bin/python benchmarks/admission.py [--requests 100000] [--flushes 300]
        [--rate 2000] [--seconds 5]
        [--database-url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import scratch_database
from gateway.budgets import DEFAULT_ALERTS, Period, parse_scope
from gateway.db import spend
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from gateway.serving import leases
from gateway.serving.admission import Admission
from tests.factories import Tenant, tenants
from tests.spend.workers import context, worker

SCENARIOS = ("none", "budget", "both")
SPEND_FLUSH_S = getattr(leases, "SPEND_FLUSH_S", 0.0)  # as the gateway has it


BLOCK = 1000  # requests per block; the scenarios' blocks take turns


def measure(directory: Path, requests: int) -> dict[str, tuple[float, float, int]]:
    """Per scenario: CPU microseconds per admit and settle (median block), the median
    over rounds of its block's CPU against the no-rule block's of the same round, and the
    statements run while measuring. The scenarios take turns, a block each, so a change in
    the machine's speed (this host's swings by two for seconds at a time) falls on all of
    them alike: the ratio holds where the microseconds do not."""
    setups = {s: governed(f"sqlite:///{directory / s}.db", s) for s in SCENARIOS}
    statements = dict.fromkeys(SCENARIOS, 0)
    times: dict[str, list[float]] = {s: [] for s in SCENARIOS}

    def counter(scenario: str) -> Callable[..., None]:
        def seen(*_: object) -> None:
            statements[scenario] += 1

        return seen

    async def main() -> None:
        number = 0
        for _, admission, acme in setups.values():
            for _ in range(5 * BLOCK):  # warm-up: the slices taken, the plans made
                await one(admission, acme, number)
                number += 1
        listeners = {s: counter(s) for s in SCENARIOS}
        for scenario, (engine, _, _) in setups.items():
            event.listen(engine, "before_cursor_execute", listeners[scenario])
        for round_ in range(max(requests // BLOCK, 1)):
            order = SCENARIOS if round_ % 2 == 0 else SCENARIOS[::-1]
            for scenario in order:
                _, admission, acme = setups[scenario]
                started = time.thread_time()
                for _ in range(BLOCK):
                    await one(admission, acme, number)
                    number += 1
                times[scenario].append(time.thread_time() - started)
        for scenario, (engine, admission, _) in setups.items():
            event.remove(engine, "before_cursor_execute", listeners[scenario])
            await admission.close()

    asyncio.run(main())
    for engine, _, _ in setups.values():
        engine.dispose()
    base = times["none"]
    return {
        s: (
            statistics.median(t) * 1e6 / BLOCK,
            statistics.median(x / y for x, y in zip(t, base, strict=True)),
            statements[s],
        )
        for s, t in times.items()
    }


def flushes(url: str, count: int) -> tuple[float, float]:
    """Median CPU milliseconds of one flush of a budget's and a rate limit's slices, each
    with a request's spend to flush (due at every flush here), and the statements per
    flush."""
    leases.SPEND_FLUSH_S = 0.0
    engine, admission, acme = governed(url, "both")
    statements = [0]

    def seen(*_: object) -> None:
        statements[0] += 1

    async def main() -> list[float]:
        for number in range(20):
            await one(admission, acme, number)
        await admission.flush()
        times = []
        event.listen(engine, "before_cursor_execute", seen)
        for number in range(count):
            await one(admission, acme, 20 + number)
            started = time.process_time()
            await admission.flush()
            times.append(time.process_time() - started)
        event.remove(engine, "before_cursor_execute", seen)
        await admission.close()
        return times

    times = asyncio.run(main())
    engine.dispose()
    leases.SPEND_FLUSH_S = SPEND_FLUSH_S
    return statistics.median(times) * 1e3, statements[0] / count


def ticking(url: str, rate: int, seconds: float) -> tuple[float, float, float]:
    """A worker busy at ``rate`` requests a second for ``seconds`` (a budget and a rate
    limit), ticking every ``FLUSH_S``: per second, the CPU milliseconds of its ticks, the
    transactions and the statements they ran."""
    engine, admission, acme = governed(url, "both")
    statements, commits = [0], [0]

    def seen(*_: object) -> None:
        statements[0] += 1

    def committed(*_: object) -> None:
        commits[0] += 1

    async def main() -> float:
        for number in range(20):
            await one(admission, acme, number)
        await admission.flush()
        event.listen(engine, "before_cursor_execute", seen)
        event.listen(engine, "commit", committed)
        cpu, number, per_tick = 0.0, 20, round(rate * leases.FLUSH_S)
        ticks = round(seconds / leases.FLUSH_S)
        begun = time.monotonic()
        for tick in range(1, ticks + 1):
            for _ in range(per_tick):
                await one(admission, acme, number)
                number += 1
            await asyncio.sleep(max(begun + tick * leases.FLUSH_S - time.monotonic(), 0.0))
            started = time.process_time()
            await admission.flush()
            cpu += time.process_time() - started
        event.remove(engine, "before_cursor_execute", seen)
        event.remove(engine, "commit", committed)
        await admission.close()
        return cpu

    cpu = asyncio.run(main())
    engine.dispose()
    return cpu * 1e3 / seconds, commits[0] / seconds, statements[0] / seconds


async def one(admission: Admission, tenant: Tenant, number: int) -> None:
    """One request admitted and settled (30 tokens)."""
    admitted = await admission.admit(context(tenant, number))
    admitted.tokens += 30
    await admission.settle(admitted)


def governed(url: str, scenario: str) -> tuple[Engine, Admission, Tenant]:
    """A migrated database at ``url`` with the scenario's rules on tenant acme, and one
    worker's admission following them."""
    upgrade(url)
    engine = make_engine(url)
    [acme] = tenants(engine, "acme").values()
    scope = parse_scope("tenant:acme")
    with transaction(session_factory(engine)) as session:
        if scenario != "none":
            spend.set_budget(
                session,
                scope=scope,
                limit=Decimal(1_000_000),
                period=Period.MONTH,
                alert_at=DEFAULT_ALERTS,
            )
        if scenario == "both":
            spend.set_limit(
                session,
                scope=scope,
                requests_per_minute=100_000_000,
                tokens_per_minute=100_000_000_000,
            )
    return engine, worker(engine, lambda: datetime.now(UTC)), acme


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000, help="per scenario")
    parser.add_argument("--flushes", type=int, default=300, help="flushes timed")
    parser.add_argument("--rate", type=int, default=2000, help="a busy worker's requests/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long it is busy")
    parser.add_argument("--database-url", help="a Postgres server for the flushes too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvgate-admission-") as tmp:
        print(
            f"{'scenario':8} | CPU per admit+settle | against none, same rounds | "
            "statements while measuring"
        )
        for scenario, (micros, ratio, statements) in measure(Path(tmp), args.requests).items():
            print(f"{scenario:8} | {micros:17.1f} µs | {ratio:24.2f}x | {statements}")
        print("\none flush writing spend to a budget's and a rate limit's slices (3 counters):")
        urls = [("sqlite", *(f"sqlite:///{Path(tmp) / name}.db" for name in ("f", "t")))]
        with contextlib.ExitStack() as stack:
            if args.database_url:
                scratch = (
                    stack.enter_context(scratch_database(args.database_url, "kvgate_adm_"))
                    for _ in range(2)
                )
                urls.append(("postgres", *scratch))
            for name, url, _ in urls:
                millis, statements = flushes(url, args.flushes)
                print(f"{name:8} | {millis:.2f} ms CPU | {statements:.1f} statements")
            print(
                f"\na worker busy at {args.rate} requests/s for {args.seconds:g} s, ticking "
                f"every {leases.FLUSH_S:g} s: its ticks, per second"
            )
            for name, _, url in urls:
                millis, commits, statements = ticking(url, args.rate, args.seconds)
                print(
                    f"{name:8} | {millis:.2f} ms CPU | {commits:.1f} transactions | "
                    f"{statements:.1f} statements"
                )


if __name__ == "__main__":
    main()
