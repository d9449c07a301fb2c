"""Statement lines split by usage source: a customer sees which tokens were estimated.

Failed and cancelled streams are billed on usage kvgate estimated; an attempt with no
usage at all (missing) has its own line: zero tokens, zero cost, still an attempt.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta

import orjson

from gateway import billing
from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.db import crud
from gateway.db.session import make_engine, session_factory, transaction
from gateway.usage import Usage, UsageSource
from pricing.book import PriceBook, price_from_mapping
from pricing.cost import Cost, compute

PRICE = price_from_mapping(
    {
        "model": "m",
        "effective_from": "2026-07-01",
        "input": "0.15",
        "cache_read": "0.015",
        "output": "0.45",
    }
)
BOOK = PriceBook([PRICE])
STARTED = datetime(2026, 7, 3, 12, tzinfo=UTC)


def attempt(n: int, tenant: str, usage: Usage, status: Status, model: str = "m") -> Record:
    price = BOOK.price_for(model, at=STARTED)
    return Record(
        request_id=f"r{n}",
        tenant_id=tenant,
        api_key_id="key",
        interaction_id=f"i{n}",
        model=model,
        deployment=model,
        upstream="http://r1",
        started_at=STARTED + timedelta(minutes=n),
        ended_at=STARTED + timedelta(minutes=n, seconds=1),
        status=status,
        usage=usage,
        price_id=price.id if price else None,
        rate_class="standard" if price else None,
        cost=compute(usage, price) if price else Cost(),
    )


def test_lines_split_by_usage_source_and_totals_count_estimates(database_url: str) -> None:
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    with transaction(sessions) as session:
        crud.add_prices(session, prices=[PRICE])
        tenant = crud.create_tenant(session, name="s").id
    estimated = UsageSource.ESTIMATED
    insert_records(
        engine,
        [
            attempt(1, tenant, Usage(100, 0, 0, 10), Status.COMPLETED),
            attempt(2, tenant, Usage(200, 50, 0, 20), Status.COMPLETED),
            attempt(3, tenant, Usage(300, 0, 0, 7, source=estimated), Status.CANCELLED),
            attempt(4, tenant, Usage.missing(), Status.FAILED),
            attempt(5, tenant, Usage(40, 0, 0, 4, source=estimated), Status.CANCELLED, "free"),
        ],
    )
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="s"),
            start=date(2026, 7, 3),
            end=date(2026, 7, 3),
        )
    engine.dispose()
    document = orjson.loads(billing.to_json(statement))
    shown = [
        (
            line["model"],
            line["usage_source"],
            line["priced"],
            line["requests"],
            line["completed_interactions"],
            line["uncached_tokens"] + line["cache_read_tokens"] + line["output_tokens"],
            line["cost_total"],
        )
        for line in document["line_items"]
    ]
    assert shown == [
        ("free", "estimated", False, 1, 0, 44, None),
        # 300 × 0.15 + 50 × 0.015 + 30 × 0.45 (per 1M) = 0.000045 + 0.00000075 + 0.0000135
        ("m", "reported", True, 2, 2, 380, "0.000059250"),
        # 300 × 0.15 + 7 × 0.45 = 0.000045 + 0.00000315, on usage kvgate estimated
        ("m", "estimated", True, 1, 0, 307, "0.000048150"),
        # No usage at all: an attempt with no tokens and nothing charged.
        ("m", "missing", True, 1, 0, 0, "0.000000000"),
    ]
    totals = document["totals"]
    assert (
        totals["requests"],
        totals["estimated_requests"],
        totals["estimated_tokens"],
        totals["missing_requests"],
        totals["cost_total"],
    ) == (5, 2, 351, 1, "0.000107400")
    rows = list(csv.DictReader(io.StringIO(billing.to_csv(statement).decode())))
    assert [row["usage_source"] for row in rows] == [
        "estimated",
        "reported",
        "estimated",
        "missing",
        "",
    ]
    assert (rows[-1]["estimated_requests"], rows[-1]["estimated_tokens"]) == ("2", "351")
