"""`kvgate dashboard` as a real process on loopback, on a seeded SQLite database.

The tenants have names no page would show by accident, so a test that looks for them (and
for the spend they add up to) in what reaches a client knows data when it sees it.
SQLite only: what the sign-in gate lets through does not depend on the database
(tests/dashboard/test_pages.py renders every page on both).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from sqlalchemy import update

from dashboard import formatting
from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.budgets import DEFAULT_ALERTS, Period, parse_scope
from gateway.db import crud, spend
from gateway.db.migrate import upgrade
from gateway.db.models import BudgetRow
from gateway.db.session import make_engine, session_factory, transaction
from gateway.usage import Usage
from tests.dashboard.conftest import JAN, JUL, at, make, world_records
from tests.support.processes import Proc, free_port, wait_http

TENANTS = ("zephyr-holdings-8841", "quokka-labs-2297")
PASSWORD = "correct-horse-battery-5521"
JUNE_22, JUNE_23 = datetime(2026, 6, 22, 9, tzinfo=UTC), datetime(2026, 6, 23, 14, tzinfo=UTC)
# What a production dashboard needs besides its password (real-looking, not placeholders).
PRODUCTION = {
    "KVGATE_ENVIRONMENT": "production",
    "KVGATE_SECRET": "a-real-server-secret-for-tests-0f3a",
    "KVGATE_ADMIN_TOKEN": "a-real-admin-token-for-tests-77c1",
}


@dataclass(frozen=True)
class Seeded:
    """The dashboard's URL and what its pages show once signed in."""

    url: str
    proc: Proc
    # The spend over both tenants, as the overview shows it ("0.172992355"), and each
    # tenant's (by name) as its tiles show it.
    total_spend: str
    tenant_spend: dict[str, str]

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every string that is data: none may reach a client before sign-in."""
        return (*TENANTS, self.total_spend, *self.tenant_spend.values())


def amount(value: Decimal) -> str:
    """A money figure as the dashboard writes it, less the currency."""
    return formatting.money(value, None)


def previous_records(a: str, b: str) -> list[Record]:
    """Traffic in the week before the one the dashboard opens on (June 25 to July 1), so
    every overview tile has a previous value to show its change against: cold and warm
    TTFTs, a routed request with its ceiling, a failed attempt and its retry."""
    return [
        make(20, a, JUNE_22, Usage(1000, 0, 0, 80), interaction="p1", ttft_ms=500),
        make(
            21,
            a,
            JUNE_22 + timedelta(hours=2),
            Usage(300, 700, 0, 40),
            interaction="p2",
            ttft_ms=150,
            upstream="http://r2",
            predicted=700,
            ceiling=800,
        ),
        make(22, b, JUNE_23, Usage(400, 0, 0, 10), interaction="p3", status=Status.FAILED,
             upstream="http://r2", error="upstream 503"),
        make(23, b, JUNE_23 + timedelta(seconds=3), Usage(400, 0, 0, 60), interaction="p3",
             attempt=2, ttft_ms=900),
    ]  # fmt: skip


def seed(url: str) -> tuple[str, dict[str, str]]:
    """Two tenants with the test world's requests, and one more that gives the second an
    unmistakable spend; some traffic the week before (``previous_records``); a monthly
    budget on each, part spent now, and a few refusals (they cost nothing); the spend in
    all and by tenant, in the week the dashboard opens on."""
    upgrade(url)
    engine = make_engine(url)
    with transaction(session_factory(engine)) as session:
        crud.add_prices(session, prices=[JAN, JUL])
        ids = [crud.create_tenant(session, name=name).id for name in TENANTS]
    records = [
        *world_records(*ids),
        make(8, ids[1], at(1, 3), Usage(123_457, 0, 0, 7_777), interaction="i8"),
    ]
    before = previous_records(*ids)
    refused = [
        make(9 + n, ids[n % 2], at(1, 1 + n), Usage.missing(), interaction=f"r{n}",
             status=Status.REFUSED, prices=None, upstream="",
             error="budget bud_x cannot cover this request" if n % 3 else "rate limit reached")
        for n in range(5)
    ]  # fmt: skip
    insert_records(engine, [*before, *records, *refused])
    with transaction(session_factory(engine)) as session:
        for name, limit, spent in zip(TENANTS, ("25", "2"), ("7.5", "1.95"), strict=True):
            budget = spend.set_budget(
                session,
                scope=parse_scope(f"tenant:{name}"),
                limit=Decimal(limit),
                period=Period.MONTH,
                alert_at=DEFAULT_ALERTS,
            )
            start, _ = budget.bounds(datetime.now(UTC))
            # Set when its month began, so its burn rate is over the month so far.
            session.execute(
                update(BudgetRow).where(BudgetRow.id == budget.id).values(created_at=start)
            )
            charge = spend.Charge(budget.id, "", start, budget.limit, Decimal(spent))
            assert spend.reserve(session, [charge]) is None
            spend.settle(session, [charge], charge.amount)
    engine.dispose()
    each = {
        name: amount(sum((r.cost.total for r in records if r.tenant_id == i), Decimal(0)))
        for name, i in zip(TENANTS, ids, strict=True)
    }
    return amount(sum((r.cost.total for r in records), Decimal(0))), each


@contextmanager
def dashboard(tmp_path: Path, **settings: str) -> Iterator[Seeded]:
    """A dashboard process with ``settings`` (KVGATE_* names) on a seeded database."""
    url = f"sqlite:///{tmp_path / 'kvgate.db'}"
    total, each = seed(url)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update({"KVGATE_DATABASE_URL": url, "HOME": str(tmp_path), **settings})
    log = tmp_path / f"dashboard-{port}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "dashboard", "--port", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    proc = Proc(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_http(proc.url + "/_stcore/health", timeout_s=60, process=process)
        yield Seeded(proc.url, proc, total, each)
    finally:
        proc.stop()
        if process.returncode not in (0, -15):
            print(proc.output())
