"""A worker's slice is one object from its first request to its last settlement: a slice
going back while it sat idle, or a sync slower than the idle time, never leaves a
request holding a slice the worker has forgotten (its spend would never reach the
counter, and a new slice of the same counter would overwrite its hold)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gateway.budgets import DEFAULT_ALERTS, Period, parse_scope
from gateway.db import spend
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from gateway.serving.leases import IDLE_S, Leases
from tests.factories import tenants

AT = datetime(2026, 12, 1, 12, tzinfo=UTC)
AMOUNT = Decimal("0.010000000")  # a request's largest cost; the slice: 8 of them
COST = Decimal("0.004000000")  # what it came to


def _leases(url: str) -> tuple[Leases, spend.Charge]:
    """A worker's leases of a tenant's daily budget of 1, and one request's charge on it."""
    upgrade(url)
    engine = make_engine(url)
    tenants(engine, "acme")
    factory = session_factory(engine)
    with transaction(factory) as session:
        budget = spend.set_budget(
            session,
            scope=parse_scope("tenant:acme"),
            limit=Decimal(1),
            period=Period.DAY,
            timezone="UTC",
            alert_at=DEFAULT_ALERTS,
        )
    start, _ = budget.bounds(AT)
    leases = Leases(sessions=factory, hold_ttl=timedelta(seconds=60), clock=lambda: AT)
    return leases, spend.Charge(budget.id, "", start, budget.limit, AMOUNT)


def _counter(leases: Leases, charge: spend.Charge) -> tuple[Decimal, Decimal]:
    with leases.sessions() as session:
        return spend.counter(session, charge.budget_id, charge.period_start)


async def _idle_then_busy(leases: Leases, charge: spend.Charge) -> None:
    """One request served and settled; the slice idle; a request arrives while the
    flush gives the idle slice back, and waits for that sync."""
    assert await leases.take((charge,)) is None
    leases.settle((charge,), COST)
    await leases.tick({charge.budget_id})  # flushed
    leases.leases[charge.key].last_used = time.monotonic() - 2 * IDLE_S  # idle since
    giving_back = asyncio.ensure_future(leases.tick({charge.budget_id}))
    await asyncio.sleep(0)  # the flush's sync is under way, in its thread
    assert leases.leases[charge.key].syncing is not None
    assert await leases.take((charge,)) is None
    await giving_back


def test_a_request_arriving_as_an_idle_slice_goes_back_keeps_its_slice(
    empty_database_url: str,
) -> None:
    leases, charge = _leases(empty_database_url)

    async def run() -> tuple[Decimal, Decimal]:
        await _idle_then_busy(leases, charge)
        # The slice the request took from is the one the worker holds and flushes.
        assert leases.total(charge.key) == COST + AMOUNT
        assert charge.key in leases.leases
        leases.settle((charge,), COST)
        await leases.close()
        return _counter(leases, charge)

    # Both requests' costs reached the counter, and nothing is held once closed.
    assert asyncio.run(run()) == (2 * COST, Decimal(0))


def test_a_sync_slower_than_the_idle_time_keeps_the_slice_it_fills(
    empty_database_url: str,
) -> None:
    leases, charge = _leases(empty_database_url)

    async def run() -> tuple[Decimal, Decimal]:
        sync = leases._sync

        def slow(requests: list[spend.LeaseSync]) -> list[tuple[Decimal, Decimal]]:
            time.sleep(0.05)
            return sync(requests)

        leases._sync = slow  # type: ignore[method-assign]
        taking = asyncio.ensure_future(leases.take((charge,)))
        await asyncio.sleep(0)  # the request's sync is under way
        # The worker's flush, as the request's wait passes the idle time.
        leases.leases[charge.key].last_used = time.monotonic() - 2 * IDLE_S
        await leases.tick({charge.budget_id})
        assert await taking is None
        assert leases.total(charge.key) == AMOUNT
        leases.settle((charge,), COST)
        await leases.close()
        return _counter(leases, charge)

    assert asyncio.run(run()) == (COST, Decimal(0))
