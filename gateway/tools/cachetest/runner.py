"""One `kvgate cachetest` run: find out what the target is, run the chosen stages in order,
read kvgate's statement around them, and hand the results to the report."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, TextIO, TypeVar

from gateway.routing.load import CacheConfig
from gateway.tools.cachetest import (
    cold_warm,
    concurrency,
    eviction,
    isolation,
    partial,
)
from gateway.tools.cachetest.client import Endpoint, Outcome
from gateway.tools.cachetest.cold_warm import ColdWarm
from gateway.tools.cachetest.concurrency import Concurrency
from gateway.tools.cachetest.context import Context
from gateway.tools.cachetest.costs import statement_price
from gateway.tools.cachetest.eviction import Eviction
from gateway.tools.cachetest.isolation import Isolation, Verdict, judge
from gateway.tools.cachetest.partial import Partial
from gateway.tools.cachetest.plan import Plan, RunConfig
from gateway.tools.cachetest.progress import Progress
from gateway.tools.totals import StatementTotals
from pricing.book import Rates

T = TypeVar("T")
DEFAULT_BLOCK_SIZE = 16
# kvgate writes records in batches: how long to wait for the statement to show the run.
STATEMENT_WAIT_S = 15.0

_PLANNED = {
    "cold-warm": cold_warm.planned,
    "partial": partial.planned,
    "concurrency": concurrency.planned,
    "eviction": eviction.planned,
    "isolation": isolation.planned,
}


@dataclass(frozen=True, slots=True)
class Results:
    """What a run produced: each stage's result, where the numbers came from, how long."""

    config: RunConfig
    block_size: int
    block_size_source: str  # "--block-size", "target /metrics" or "default"
    cache: CacheConfig | None
    kvgate: bool  # the target answered the billing statement
    price: Rates | None
    price_source: str | None  # "command line", "kvgate statement" or None
    billed: StatementTotals | None  # the first key's statement, after minus before
    started_at: datetime
    wall_s: float
    stage_wall_s: dict[str, float]
    sent: tuple[Outcome, ...]  # every request of the first key
    cold_warm: ColdWarm | None = None
    partial: Partial | None = None
    concurrency: Concurrency | None = None
    eviction: Eviction | None = None
    isolation: Isolation | None = None

    @property
    def verdict(self) -> Verdict | None:
        """The isolation verdict, when that stage ran."""
        if self.isolation is None:
            return None
        return judge(self.isolation, self.config.audit)

    @property
    def failed(self) -> bool:
        """Isolation failed: the exit status is non-zero."""
        verdict = self.verdict
        return verdict is not None and verdict.failed


def planned_requests(plan: Plan, stages: tuple[str, ...]) -> int:
    """How many requests the stages send (eviction: at most)."""
    return sum(_PLANNED[stage](plan) for stage in stages)


async def run(config: RunConfig, *, stream: TextIO | None = None) -> Results:
    """Run the stages of ``config`` against its target."""
    started_at = datetime.now(UTC)
    clock = time.perf_counter()
    progress = Progress(planned_requests(config.plan, config.stages), stream)
    async with Endpoint(config.target, config.model, max_tokens=config.max_tokens) as endpoint:
        cache = await endpoint.cache_config()
        if config.block_size is not None:
            block_size, block_source = config.block_size, "--block-size"
        elif cache is not None:
            block_size, block_source = cache.block_size, "target /metrics"
        else:
            block_size, block_source = DEFAULT_BLOCK_SIZE, "default"
        day = started_at.date()
        before = await endpoint.statement(config.key, start=day, end=day)
        ctx = Context(endpoint, config, progress, block_size=block_size)
        stage_wall: dict[str, float] = {}
        found: dict[str, object] = {}
        for stage in config.stages:
            progress.start(stage)
            stage_clock = time.perf_counter()
            found[stage] = await _STAGES[stage](ctx)
            stage_wall[stage] = time.perf_counter() - stage_clock
        billed, price, price_source = None, config.price, "command line" if config.price else None
        if before is not None:
            progress.start("statement")
            after = await _settled(endpoint, config.key, day, before, len(ctx.sent))
            billed = StatementTotals.of(after).minus(StatementTotals.of(before))
            if price is None:
                price = statement_price(after, config.model)
                price_source = "kvgate statement" if price is not None else None
        progress.close()
    return Results(
        config=config,
        block_size=block_size,
        block_size_source=block_source,
        cache=cache,
        kvgate=before is not None,
        price=price,
        price_source=price_source,
        billed=billed,
        started_at=started_at,
        wall_s=time.perf_counter() - clock,
        stage_wall_s=stage_wall,
        sent=tuple(ctx.sent),
        cold_warm=_found(found, "cold-warm", ColdWarm),
        partial=_found(found, "partial", Partial),
        concurrency=_found(found, "concurrency", Concurrency),
        eviction=_found(found, "eviction", Eviction),
        isolation=_found(found, "isolation", Isolation),
    )


_STAGES: dict[str, Callable[[Context], Awaitable[object]]] = {
    "cold-warm": cold_warm.run,
    "partial": partial.run,
    "concurrency": concurrency.run,
    "eviction": eviction.run,
    "isolation": isolation.run,
}


def _found(found: dict[str, object], stage: str, kind: type[T]) -> T | None:
    result = found.get(stage)
    if result is not None and not isinstance(result, kind):
        raise TypeError(f"stage {stage} returned {type(result).__name__}")
    return result


async def _settled(
    endpoint: Endpoint, key: str, day: date, before: dict[str, Any], sent: int
) -> dict[str, Any]:
    """The statement once it counts every request the first key sent (or after a wait)."""
    deadline = time.monotonic() + STATEMENT_WAIT_S
    latest = before
    while True:
        today = datetime.now(UTC).date()
        found = await endpoint.statement(key, start=day, end=today)
        if found is not None:
            latest = found
            counted = int(found["totals"]["requests"]) - int(before["totals"]["requests"])
            if counted >= sent:
                return latest
        if time.monotonic() > deadline:
            return latest
        await asyncio.sleep(0.2)
