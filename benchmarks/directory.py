"""What keeping keys and prices current costs (gateway/directory/, db/feed.py).

1. On the request path: a known key's look-up (``KeyRing.authenticate``, the one place
   the change check runs, once per request), with no check and with the database's own
   (SQLite: ``PRAGMA data_version``; Postgres: nothing, notifications arrive by themselves).
2. Off it: how long a change takes to reach a gateway process. SQLite: the first check
   after the commit (which reloads). Postgres: ``changes.publish`` until every listening
   process confirmed it holds the change (what ``kvgate prices add`` waits for), with
   ``--listeners`` feeds in this process.

    .venv/bin/python benchmarks/directory.py [--database-url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import scratch_database
from gateway.auth import KeyRing
from gateway.db import changes, crud
from gateway.db.feed import make_feed
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from gateway.mirror import Mirror
from pricing.book import PriceBook, load_catalog, price_from_mapping

LOOKUPS = 200_000
CHANGES = 30


def per_call_us(work: Callable[[], object], count: int = LOOKUPS) -> float:
    """Median of 5 runs of ``count`` calls, microseconds per call."""
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(count):
            work()
        runs.append((time.perf_counter() - started) / count * 1e6)
    return statistics.median(runs)


async def authenticate_us(ring: KeyRing, header: str) -> float:
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(LOOKUPS // 4):
            await ring.authenticate(header)
        runs.append((time.perf_counter() - started) / (LOOKUPS // 4) * 1e6)
    return statistics.median(runs)


async def measure(url: str, listeners: int) -> None:
    upgrade(url)
    engine = make_engine(url)
    sessions = session_factory(engine)
    with transaction(sessions) as session:
        crud.create_tenant(session, name="bench")
        issued = crud.create_key(session, tenant_name="bench")
        crud.add_prices(session, prices=load_catalog())

    def load_keys() -> tuple[int, dict]:  # type: ignore[type-arg]
        with sessions() as session:
            return crud.active_keys(session)

    def load_prices() -> tuple[int, PriceBook]:
        with sessions() as session:
            return crud.current_prices(session)

    feeds = [make_feed(engine) for _ in range(max(1, listeners))]
    rings = [KeyRing(load_keys, fresh=feed.check) for feed in feeds]
    prices = [Mirror("prices", load_prices, PriceBook()) for _ in feeds]
    for feed, ring, mirror in zip(feeds, rings, prices, strict=True):
        await ring.refresh()
        mirror.reload()
        feed.watch(ring.mirror)
        feed.watch(mirror)
        await feed.start()
        await feed.ready(10)
    dialect = engine.dialect.name
    header = f"Bearer {issued.key}"
    bare = KeyRing(load_keys)
    await bare.refresh()
    print(f"{dialect}: on the request path (median of 5 runs)")
    print(f"  change check alone        {per_call_us(feeds[0].check):7.3f} µs")
    print(f"  known key, no check       {await authenticate_us(bare, header):7.3f} µs")
    print(f"  known key, checked        {await authenticate_us(rings[0], header):7.3f} µs")

    took = []
    for n in range(CHANGES):
        price = price_from_mapping(
            {"model": "bench", "effective_from": f"2030-01-01T00:00:{n:02d}Z",
             "input": n, "cache_read": 1, "output": 1}
        )  # fmt: skip
        started = time.perf_counter()
        _, published = await asyncio.to_thread(
            changes.publish, sessions, lambda s, p=price: crud.add_prices(s, prices=[p])
        )
        if dialect == "sqlite":
            feeds[0].check()  # the next request's check: reloads
        took.append((time.perf_counter() - started) * 1000)
        assert all(m.revision == published.revisions["prices"] for m in prices[:1])
    what = (
        "commit + the next check's reload"
        if dialect == "sqlite"
        else (f"commit until {len(feeds)} listener(s) confirmed")
    )
    print(
        f"  a price change, {what}: p50 {statistics.median(took):.1f} ms, "
        f"max {max(took):.1f} ms over {CHANGES} changes"
    )
    for feed in feeds:
        await feed.stop()
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a Postgres server (a scratch database is made)")
    parser.add_argument("--listeners", type=int, default=4, help="Postgres: feeds to confirm")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(measure(f"sqlite:///{Path(tmp) / 'bench.db'}", 1))
    if args.database_url:
        with scratch_database(args.database_url, "kvgate_bench_directory_") as url:
            asyncio.run(measure(url, args.listeners))


if __name__ == "__main__":
    main()
