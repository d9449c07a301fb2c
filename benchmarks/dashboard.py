"""Load 1,000,000 synthetic records into Postgres and time every dashboard page's queries.

The records go in through ``insert_records``, the recorder's own write path, so the
hourly rollups are built as in production and the load rate is measured with them; or,
with ``--load copy``, they are COPYed in and the rollups built in SQL from them
(``dashboard_load.py``, checked row for row against the writer's by
tests/test_dashboard_load.py), which loads 10,000,000 in about 20 minutes. Then each
page's loader (``dashboard.data``, what the page runs) is timed over a 30-day and a 7-day
period, all tenants and one tenant: the target is under 1 s per page at 1,000,000 records
and under 2 s at 10,000,000.

    .venv/bin/python benchmarks/dashboard.py                  # load (about 15 min), then time
    .venv/bin/python benchmarks/dashboard.py --skip-load      # time an existing load again
    .venv/bin/python benchmarks/dashboard.py --load copy --records 10000000 \
        --url postgresql://postgres@127.0.0.1:5432/kvgate_bench10m

The workload (seeded): 30 days, 12 tenants, three priced models (two vLLM pools of four
replicas, one hosted model) and a little unpriced traffic; a shared system prompt per
tenant, so cache hits vary from none to most of the prompt; 6 % of interactions retried
after a failed attempt, 1 % failing outright; 10 % agent tasks of 3-8 calls over up to 20
minutes under one interaction id (some cross an hour); routing figures (predicted and
ceiling cached tokens) on the vLLM pools for the last 10 days only.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

# Run as a script, this file's folder comes first on sys.path and its name would hide the
# dashboard package; the checkout's root goes first instead (its code, not an install's).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from benchmarks import dashboard_load  # noqa: E402
from dashboard import context, data  # noqa: E402
from dashboard.view import View  # noqa: E402
from gateway.accounting.recorder import insert_records  # noqa: E402
from gateway.accounting.records import Record, Status  # noqa: E402
from gateway.db import crud  # noqa: E402
from gateway.db.gpu_costs import GpuCost, add_gpu_cost  # noqa: E402
from gateway.db.migrate import upgrade  # noqa: E402
from gateway.db.session import make_engine, normalise_url, session_factory, transaction  # noqa: E402
from gateway.usage import Usage  # noqa: E402
from pricing.book import PriceBook, price_from_mapping  # noqa: E402
from pricing.cost import Cost, compute  # noqa: E402

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/kvgate_bench"
END = datetime(2026, 11, 1, tzinfo=UTC)
DAYS = 30
TENANTS = 12
PRICES = [
    price_from_mapping(
        {
            "model": model,
            "effective_from": since,
            "input": i,
            "cache_read": r,
            "output": o,
            "source": "benchmark",
        }
    )
    for model, since, i, r, o in [
        ("kvgate/llama-8b", "2026-01-01", "0.20", "0.02", "0.60"),
        ("kvgate/llama-8b", "2026-10-15", "0.15", "0.015", "0.45"),
        ("kvgate/llama-70b", "2026-01-01", "0.90", "0.09", "2.70"),
        ("openai/gpt-4o-mini", "2026-01-01", "0.15", "0.075", "0.60"),
        ("openai/gpt-4o-mini", "2026-10-20", "0.12", "0.06", "0.48"),
    ]
]
BOOK = PriceBook(PRICES)
POOLS = {
    "kvgate/llama-8b": [f"http://vllm-8b-{n}:8000" for n in range(1, 5)],
    "kvgate/llama-70b": [f"http://vllm-70b-{n}:8000" for n in range(1, 5)],
    "openai/gpt-4o-mini": ["litellm:openai"],
    "kvgate/experimental": ["http://vllm-exp-1:8000"],  # no price entry: unpriced
}
MODEL_WEIGHTS = [0.55, 0.25, 0.19, 0.01]
ROUTING_FROM = END - timedelta(days=10)
# What the vLLM pools cost to run (the Models page's cost to serve, operators only).
GPU_COSTS = [
    GpuCost(model, END - timedelta(days=60), Decimal(per_hour), len(POOLS[model]), Decimal(4))
    for model, per_hour in (("kvgate/llama-8b", "1.20"), ("kvgate/llama-70b", "4.80"))
]


def attempt(
    rng: random.Random,
    n: int,
    tenant: str,
    interaction: str,
    number: int,
    model: str,
    started: datetime,
    status: Status,
    system: int,
) -> Record:
    prompt = system + rng.randint(50, 3000)
    cached = 0 if rng.random() < 0.2 else min(system, prompt - 1) // 16 * 16
    usage = Usage(
        prompt - cached, cached, 0, 0 if status is Status.FAILED else rng.randint(20, 800)
    )
    ttft = rng.lognormvariate(-1.0 if cached else 0.0, 0.5)
    routed = model.startswith("kvgate/llama") and started >= ROUTING_FROM
    price = BOOK.price_for(model, at=started)
    return Record(
        request_id=f"req_{n:08d}",
        tenant_id=tenant,
        api_key_id=f"key_{tenant}",
        interaction_id=interaction,
        attempt=number,
        model=model,
        deployment=model,
        upstream=rng.choice(POOLS[model]),
        policy="kv-aware" if routed else "round-robin",
        started_at=started,
        ended_at=started + timedelta(seconds=ttft + 2),
        first_token_at=None if status is Status.FAILED else started + timedelta(seconds=ttft),
        status=status,
        usage=usage,
        price_id=price.id if price else None,
        cost=compute(usage, price) if price else Cost(),
        predicted_cached_tokens=cached + rng.choice((0, 0, 16, -16)) if routed else None,
        ceiling_cached_tokens=min(prompt - 1, cached + rng.choice((0, 0, 16, 64)))
        if routed
        else None,
        error="upstream 503" if status is Status.FAILED else None,
    )


def workload(total: int, seed: int = 7) -> Iterator[Record]:
    """``total`` attempts over DAYS days, in start order within each interaction."""
    rng = random.Random(seed)
    tenants = [f"ten_bench_{t:02d}" for t in range(TENANTS)]
    systems = {t: rng.choice((0, 512, 1024, 2048, 4096)) for t in tenants}
    span = DAYS * 86400
    n = 0
    while n < total:
        tenant = rng.choice(tenants)
        model = rng.choices(list(POOLS), MODEL_WEIGHTS)[0]
        interaction = f"int_{n:08d}"
        started = END - timedelta(seconds=rng.random() * span)
        calls = rng.randint(3, 8) if rng.random() < 0.1 else 1
        for _ in range(calls):
            roll, number = rng.random(), 1
            if roll < 0.07:  # failed attempts, retried (6 %) or not (1 %)
                yield attempt(
                    rng,
                    n,
                    tenant,
                    interaction,
                    number,
                    model,
                    started,
                    Status.FAILED,
                    systems[tenant],
                )
                n, number = n + 1, 2
                started += timedelta(seconds=rng.uniform(0.5, 3))
            status = Status.FAILED if roll < 0.01 else Status.COMPLETED
            yield attempt(
                rng, n, tenant, interaction, number, model, started, status, systems[tenant]
            )
            n += 1
            started += timedelta(seconds=rng.uniform(5, 240))
            if n >= total:
                return


def add_gpu_costs(session: Any) -> None:
    for cost in GPU_COSTS:
        add_gpu_cost(session, cost=cost)


def load(url: str, total: int, batch: int, method: str) -> None:
    admin_url = make_url(normalise_url(url)).set(database="postgres")
    name = make_url(url).database
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    upgrade(url)
    engine = make_engine(url)
    with transaction(session_factory(engine)) as session:
        crud.add_prices(session, prices=PRICES)
        add_gpu_costs(session)
    with engine.begin() as connection:
        for t in range(TENANTS):
            connection.execute(
                text("INSERT INTO tenants (id, name, created_at) VALUES (:id, :name, now())"),
                {"id": f"ten_bench_{t:02d}", "name": f"bench-{t:02d}"},
            )
    started = time.perf_counter()
    if method == "copy":
        copied = dashboard_load.copy_records(url, workload(total))
        copy_s = time.perf_counter() - started
        print(f"copied {copied:,} records in {copy_s:,.0f} s (indexes made again included)")
        for table, seconds in dashboard_load.build_rollups(url).items():
            print(f"  {table:<18} built in {seconds:,.0f} s", flush=True)
    else:
        pending, done = [], 0
        for record in workload(total):
            pending.append(record)
            if len(pending) == batch:
                insert_records(engine, pending)
                done += len(pending)
                pending = []
                if done % 100_000 == 0:
                    rate = done / (time.perf_counter() - started)
                    print(f"  {done:>9,} records  {rate:,.0f}/s", flush=True)
        insert_records(engine, pending)
    elapsed = time.perf_counter() - started
    how = "COPY, rollups in SQL" if method == "copy" else f"batches of {batch}, rollups included"
    print(f"loaded {total:,} records in {elapsed:,.0f} s ({total / elapsed:,.0f}/s, {how})")
    began = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE"))
    print(f"VACUUM ANALYZE in {time.perf_counter() - began:,.0f} s", flush=True)
    engine.dispose()


def timed(run: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median and worst wall time of ``repeats`` runs (the first warms caches)."""
    run()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
    return statistics.median(times), max(times)


def measure(url: str, repeats: int, only: str | None = None) -> None:
    engine = make_engine(url, work_mem=context.WORK_MEM)  # the dashboard's own engine
    sessions = session_factory(engine)
    with engine.connect() as connection:
        sizes = {
            table: connection.execute(text(f"SELECT count(*) FROM {table}")).scalar()
            for table in (
                "requests",
                "usage_hours",
                "replica_hours",
                "ttft_hours",
                "break_hours",
                "interactions",
                "interaction_cells",
            )
        }
        spanning = connection.execute(
            text("SELECT count(*) FROM interaction_cells WHERE spans")
        ).scalar()
    print(
        "rows: "
        + ", ".join(f"{t} {n:,}" for t, n in sizes.items())
        + f" (spanning cells {spanning:,})"
    )
    last = (END - timedelta(hours=1)).date()
    utc, tenant = ZoneInfo("UTC"), "ten_bench_03"
    views = {
        "30 days, all tenants": View(utc, last - timedelta(days=DAYS - 1), last),
        "30 days, one tenant": View(utc, last - timedelta(days=DAYS - 1), last, (tenant,)),
        "7 days, all tenants": View(utc, last - timedelta(days=6), last),
        "30 days, Europe/Paris": View(ZoneInfo("Europe/Paris"), date(2026, 10, 2), last),
    }
    pages: dict[str, Callable[[Any, View], Any]] = {
        "Overview": data.overview,
        "Tenants (table)": data.tenants,
        "Tenants (one tenant's figures)": lambda s, v: (
            data.overview(s, v.for_tenant(tenant)),
            data.attribution_of(s, v.for_tenant(tenant)),
        ),
        "  statement download (on click)": lambda s, v: data.statement(
            sessions, tenant_id=tenant, start=v.start, end=v.end, fmt="csv"
        ),
        "Models and prices": data.models,
        "  cost to serve (operators)": lambda s, v: data.serving(s, v, now=END),
        "Routing": data.routing,
        "Requests (latest 100, filtered)": lambda s, v: data.requests(
            s, v, tenant_id=tenant, model="kvgate/llama-70b", status="failed"
        ),
    }
    print(f"\n{'page':<36}{'period':<24}{'median':>10}{'worst':>10}")
    for page, loader in pages.items():
        if only is not None and only not in page:
            continue
        for label, view in views.items():

            def run(loader: Callable[[Any, View], Any] = loader, view: View = view) -> Any:
                with sessions() as session:
                    return loader(session, view)

            median, worst = timed(run, repeats)
            print(
                f"{page:<36}{label:<24}{median * 1000:>8.0f} ms{worst * 1000:>7.0f} ms", flush=True
            )
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL, help="Postgres database (recreated)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=2_000, help="records per insert")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-load", action="store_true", help="time an existing load")
    parser.add_argument(
        "--load",
        choices=("recorder", "copy"),
        default="recorder",
        help="recorder: insert_records in batches; copy: COPY, then the rollups in SQL",
    )
    parser.add_argument("--skip-measure", action="store_true", help="load only")
    parser.add_argument("--only", help="time only the pages whose name contains this")
    args = parser.parse_args()
    if not args.skip_load:
        load(args.url, args.records, args.batch, args.load)
    if not args.skip_measure:
        measure(args.url, args.repeats, args.only)


if __name__ == "__main__":
    main()
