"""What admission costs one request, in the gateway's own CPU time: a tenant no rule names,
one with a budget, one with a budget and a rate limit (requests and tokens per minute).

Steady state: the worker holds its slices (taken by a warm-up), so admission and
settlement run in memory; the statements the database ran while measuring are counted
(none expected). Time is ``time.process_time``: this process's CPU only, so other work on
a shared machine does not count in it. SQLite in a temporary directory.

    .venv/bin/python benchmarks/admission.py [--requests 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from sqlalchemy import event

from gateway.budgets import DEFAULT_ALERTS, Period, parse_scope
from gateway.db import spend
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from tests.factories import tenants
from tests.spend.workers import context, worker

SCENARIOS = ("none", "budget", "both")


def measure(directory: Path, scenario: str, requests: int) -> tuple[float, int]:
    """CPU microseconds per admit and settle, and the statements run while measuring."""
    url = f"sqlite:///{directory / scenario}.db"
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
    admission = worker(engine, lambda: datetime.now(UTC))
    statements = [0]

    def seen(*_: object) -> None:
        statements[0] += 1

    async def run(count: int) -> None:
        for number in range(count):
            admitted = await admission.admit(context(acme, number))
            admitted.tokens += 30
            await admission.settle(admitted)

    async def main() -> float:
        await run(100)  # warm-up: the slices taken
        event.listen(engine, "before_cursor_execute", seen)
        started = time.process_time()
        await run(requests)
        spent = time.process_time() - started
        event.remove(engine, "before_cursor_execute", seen)
        await admission.close()
        return spent

    spent = asyncio.run(main())
    engine.dispose()
    return spent * 1e6 / requests, statements[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000, help="per scenario")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvgate-admission-") as tmp:
        print(f"{'scenario':8} | CPU per admit+settle | statements while measuring")
        for scenario in SCENARIOS:
            micros, statements = measure(Path(tmp), scenario, args.requests)
            print(f"{scenario:8} | {micros:17.1f} µs | {statements}")


if __name__ == "__main__":
    main()
