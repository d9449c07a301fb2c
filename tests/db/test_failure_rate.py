"""Failure rate: admitted attempts that did not complete / admitted attempts.

A request refused at admission (a budget's 402, a rate limit's 429) is the client's own
limit at work: no upstream was called and nothing was paid, so it is not a failure and
not an attempt either. It counts on neither side of the rate.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy.orm import Session

from gateway.accounting.records import Record, Status
from gateway.accounting.store import insert_records
from gateway.db.figures import spend
from gateway.db.figures.spend import Scope
from gateway.db.session import make_engine
from gateway.usage import Usage
from pricing.cost import Cost

START = datetime(2026, 11, 2, 9, tzinfo=UTC)
DAY = Scope(START.replace(hour=0), START.replace(hour=0) + timedelta(days=1))


def attempt(n: int, status: Status, *, error: str | None = None) -> Record:
    refused = status == Status.REFUSED
    return Record(
        request_id=f"r{n}",
        tenant_id="t",
        api_key_id="k",
        interaction_id=f"i{n}",
        model="m",
        deployment="m",
        upstream="" if refused else "http://r1",
        started_at=START + timedelta(minutes=n),
        ended_at=START + timedelta(minutes=n, seconds=1),
        status=status,
        usage=Usage.missing() if refused else Usage(100, 0, 0, 1),
        cost=Cost(),
        error=error,
    )


def test_refused_requests_count_neither_as_failures_nor_as_attempts(database_url: str) -> None:
    """4 attempts admitted, 1 failed, 1 cancelled; 3 refusals beside them: 2 / 4, not 5 / 7."""
    engine = make_engine(database_url)
    insert_records(
        engine,
        [
            attempt(1, Status.COMPLETED),
            attempt(2, Status.COMPLETED),
            attempt(3, Status.FAILED, error="upstream 503"),
            attempt(4, Status.CANCELLED),
            attempt(5, Status.REFUSED, error="budget tenant:t exhausted"),
            attempt(6, Status.REFUSED, error="rate limit 10 requests / minute"),
            attempt(7, Status.REFUSED, error="budget tenant:t exhausted"),
        ],
    )
    with Session(engine) as session:
        totals = spend.totals(session, DAY)
        per_tenant = spend.by_tenant(session, DAY)["t"]
        (_, bucket), *_ = spend.trend(session, DAY, [DAY.lower, DAY.upper])
    engine.dispose()
    for figures in (totals, per_tenant, bucket):
        assert figures.sums.requests == 7
        assert (figures.refused.requests, figures.failed.requests, figures.admitted) == (3, 2, 4)
        assert figures.failure_rate == Decimal("0.5")
    assert spend.Figures().failure_rate is None
