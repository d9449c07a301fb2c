"""The gateway's side of reconciliation against the engine, off the request path.

    every replica_sample_s   read each replica's /metrics (its own counters), store them as
                             one sample per replica (replica_samples, in a thread)
    each window, a window    reconcile the window that closed one window ago (every request
    after it closed          started in it has ended and been written by then): per replica,
                             recorded against counted; over 1 % apart is a log line, the
                             kvgate_replica_drift_windows counter, and the drift gauge

With ``kvgate serve --workers N`` one worker does this (the one with the lowest pid among
the peers it knows); past one host, each gateway's does, each sample named by its sampler
(host:pid), and a window's figures come from one sampler's samples
(``gateway.db.figures.reconcile``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from gateway.db.figures.reconcile import Reconciled, reconcile
from gateway.db.session import Engine, SessionFactory
from gateway.db.writer.samples import insert_samples, prune_samples
from gateway.metrics import Metrics
from gateway.routing.load import read_load

log = logging.getLogger("kvgate.reconcile")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PRUNE_EVERY_S = 3600.0


def sampler_name() -> str:
    """This process, as its samples name it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def window_floor(moment: datetime, size: timedelta) -> datetime:
    """The start of the window of ``size`` (counted from the epoch, UTC) holding ``moment``."""
    return EPOCH + ((moment - EPOCH) // size) * size


class Reconciler:
    """Samples the replicas' counters and checks the windows as they close."""

    def __init__(
        self,
        *,
        engine: Engine,
        sessions: SessionFactory,
        http: aiohttp.ClientSession,
        urls: Sequence[str],
        metrics: Metrics,
        window_s: float,
        keep_days: int,
        leads: Callable[[], bool] = lambda: True,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine = engine
        self.sessions = sessions
        self.http = http
        self.urls = list(urls)
        self.metrics = metrics
        self.window = timedelta(seconds=window_s)
        self.keep = timedelta(days=keep_days)
        self.leads = leads
        self.clock = clock
        self.sampler = sampler_name()
        # Windows are checked from the one this process started in.
        self.checked_until = window_floor(clock(), self.window)
        self._pruned_at = 0.0

    async def tick(self) -> None:
        """One sample, then the check of any window that is due (the leading worker only)."""
        if not self.leads():
            return
        await self.sample()
        await self.check_due()

    async def sample(self) -> int:
        """Read every replica's counters and store them; how many replicas answered."""

        async def read(url: str) -> dict[str, Any] | None:
            at = self.clock()
            load = await read_load(self.http, url)
            if load is None:
                return None
            return {
                "upstream": url,
                "sampler": self.sampler,
                "sampled_at": at,
                "prefix_cache_queries": load.prefix_cache_queries,
                "prefix_cache_hits": load.prefix_cache_hits,
                "prompt_tokens": load.prompt_tokens,
                "generation_tokens": load.generation_tokens,
            }

        readings = await asyncio.gather(*(read(url) for url in self.urls))
        rows = [row for row in readings if row is not None]
        await asyncio.to_thread(insert_samples, self.engine, rows)
        if time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
            self._pruned_at = time.monotonic()
            await asyncio.to_thread(prune_samples, self.engine, before=self.clock() - self.keep)
        return len(rows)

    async def check_due(self) -> list[Reconciled]:
        """Check each window that closed at least one window ago and is not checked yet."""
        checked: list[Reconciled] = []
        closed_before = window_floor(self.clock(), self.window) - self.window
        while self.checked_until + self.window <= closed_before:
            start = self.checked_until
            checked += await self.check(start, start + self.window)
            self.checked_until = start + self.window
        return checked

    async def check(self, start: datetime, end: datetime) -> list[Reconciled]:
        """Reconcile one window; say where the two sides are more than 1 % apart."""

        def query() -> list[Reconciled]:
            with self.sessions() as session:
                return reconcile(
                    session, since=start, until=end, window=end - start, upstreams=self.urls
                )

        found = await asyncio.to_thread(query)
        for window in found:
            for tokens, value in (
                ("prompt", window.prompt_drift),
                ("cached", window.cached_drift),
            ):
                if value is not None:
                    self.metrics.replica_drift.labels(window.upstream, tokens).set(float(value))
            for tokens in window.over():
                self.metrics.replica_drift_windows.labels(window.upstream, tokens).inc()
                recorded, counted = (
                    (window.recorded.prompt_tokens, window.engine.prompt_tokens)
                    if tokens == "prompt"
                    else (window.recorded.cache_read_tokens, window.engine.prefix_cache_hits)
                )
                log.warning(
                    "replica %s: %s tokens %s..%s: kvgate recorded %d, the replica counted %d"
                    " (%s)%s",
                    window.upstream,
                    tokens,
                    f"{window.sampled_from:%Y-%m-%dT%H:%M:%S}Z",
                    f"{window.sampled_to:%Y-%m-%dT%H:%M:%S}Z",
                    recorded,
                    counted,
                    "no count" if counted == 0 else f"{float((recorded - counted) / counted):+.2%}",
                    "; it restarted in between" if window.restarted else "",
                )
        return found
