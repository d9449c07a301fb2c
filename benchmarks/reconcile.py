"""Time `kvgate reconcile replicas` over a day of 1,000,000 records.

Four replicas, one UTC day, 1,000,000 attempts spread evenly over it (inserted through the
recorder's own writer, so the hourly rollups are what a gateway keeps) and a sample of each
replica's counters every 60 s (5,760 samples). Timed: the reconciliation of the whole day
per hour (96 replica-windows) and per 15 minutes (384), each the median of five runs on a
warm database.

    PYTHONPATH=. .venv/bin/python benchmarks/reconcile.py                  # SQLite (temp file)
    PYTHONPATH=. .venv/bin/python benchmarks/reconcile.py --database-url postgresql://...
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from gateway.db.figures.reconcile import reconcile
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory
from gateway.db.writer import insert_requests
from gateway.db.writer.samples import insert_samples

RECORDS = 1_000_000
REPLICAS = [f"http://10.0.0.{n}:8000" for n in range(1, 5)]
DAY = datetime(2026, 7, 1, tzinfo=UTC)
BATCH = 10_000
ZERO = Decimal("0")


def row(n: int) -> dict[str, object]:
    started = DAY + timedelta(microseconds=n * 86_400_000_000 // RECORDS)
    return {
        "request_id": f"req_{n:08d}",
        "tenant_id": f"ten_{n % 20}",
        "api_key_id": "key_a",
        "interaction_id": f"int_{n // 4}",
        "attempt": 1,
        "model": "m",
        "deployment": "m",
        "upstream": REPLICAS[n % len(REPLICAS)],
        "policy": "kv-aware",
        "stream": False,
        "started_at": started,
        "first_token_at": None,
        "ended_at": started + timedelta(milliseconds=200),
        "status": "completed",
        "finish_reason": "length",
        "error": None,
        "uncached_tokens": 200,
        "cache_read_tokens": 800,
        "cache_write_tokens": 0,
        "output_tokens": 20,
        "usage_source": "reported",
        "cache_write_1h_tokens": 0,
        "service_tier": None,
        "predicted_cached_tokens": 800,
        "ceiling_cached_tokens": 800,
        "ceiling_exact": True,
        "price_id": None,
        "rate_class": None,
        "cost_uncached": ZERO,
        "cost_cache_read": ZERO,
        "cost_cache_write": ZERO,
        "cost_output": ZERO,
        "cost_total": ZERO,
        "cost_uncached_equivalent": ZERO,
        "break_tokens": None,
        "lost_tokens": None,
        "break_early": None,
        "break_context": None,
    }


def samples() -> list[dict[str, object]]:
    out = []
    per_replica_per_minute = RECORDS / len(REPLICAS) / 1440
    for minute in range(1441):
        done = int(per_replica_per_minute * minute)
        for url in REPLICAS:
            out.append(
                {
                    "upstream": url,
                    "sampler": "bench:1",
                    "sampled_at": DAY + timedelta(minutes=minute, seconds=0.5),
                    "prefix_cache_queries": done * 1000,
                    "prefix_cache_hits": done * 800,
                    "prompt_tokens": done * 1000,
                    "generation_tokens": done * 20,
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="kvgate-reconcile-")
    url = args.database_url or f"sqlite:///{Path(directory) / 'bench.db'}"
    load = os.getloadavg()[0]
    started = time.perf_counter()
    sum(range(30_000_000))
    spent = time.perf_counter() - started
    print(f"machine: load average {load:.2f}; sum(range(3e7)) in {spent:.2f} s")
    upgrade(url)
    engine = make_engine(url)
    started = time.perf_counter()
    for first in range(0, RECORDS, BATCH):
        insert_requests(engine, [row(n) for n in range(first, first + BATCH)])
    insert_samples(engine, samples())
    spent = time.perf_counter() - started
    print(f"{engine.dialect.name}: {RECORDS:,} records and 5,764 samples in {spent:.0f} s")
    sessions = session_factory(engine)
    for label, window in (
        ("per hour", timedelta(hours=1)),
        ("per 15 minutes", timedelta(minutes=15)),
    ):
        runs, found = [], []
        for _ in range(5):
            with sessions() as session:
                started = time.perf_counter()
                found = reconcile(session, since=DAY, until=DAY + timedelta(days=1), window=window)
                runs.append(time.perf_counter() - started)
        requests = sum(w.recorded.requests for w in found)
        print(
            f"reconcile a day {label}: {len(found)} replica-windows over {requests:,} records,"
            f" median {statistics.median(runs) * 1000:.0f} ms (runs: "
            + ", ".join(f"{r * 1000:.0f}" for r in runs)
            + " ms)"
        )
    engine.dispose()


if __name__ == "__main__":
    main()
