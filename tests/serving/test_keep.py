"""Keeping a record: its cost reaches the request's budgets even when the task keeping it
is cancelled (a client leaving) while the record is being made durable."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from gateway.accounting.ledger import Ledger
from gateway.accounting.records import Record, Status
from gateway.db import spend
from gateway.serving.admission import Admitted
from gateway.serving.context import Attempt, Outcome
from gateway.serving.path import Serving
from gateway.usage import Usage, UsageSource
from tests.factories import BOOK, Tenant
from tests.spend.workers import context

STARTED = datetime(2026, 7, 2, 9, tzinfo=UTC)  # JUL's prices: 0.15 in, 0.45 out per 1M


class StalledRecorder:
    """Writes a record to its journal at once, then waits on the flush that never comes."""

    def __init__(self) -> None:
        self.journaled: list[Record] = []
        self.flushed = asyncio.Event()

    async def record(self, record: Record) -> None:
        self.journaled.append(record)
        await self.flushed.wait()


async def test_a_record_kept_while_its_client_leaves_still_counts_against_its_budget() -> None:
    recorder = StalledRecorder()
    serving = Serving(ledger=Ledger(book=BOOK, recorder=recorder), backends={})  # type: ignore[arg-type]
    ctx = context(Tenant("ten_1", "acme", "kvg-x", "key_1"), 1)
    charge = spend.Charge("bud_1", "", STARTED, Decimal(1), Decimal("0.0001"))
    admitted = Admitted(request_id=ctx.request_id, leased=(charge,))
    attempt = Attempt(ctx.request_id, 1, "http://r", "m", "kv-aware", started_at=STARTED)
    outcome = Outcome(Status.COMPLETED, Usage(100, 0, 0, 8, UsageSource.REPORTED))

    keeping = asyncio.ensure_future(serving.keep(ctx, attempt, outcome, admitted=admitted))
    while not recorder.journaled:
        await asyncio.sleep(0)
    keeping.cancel()  # the client left: the record is in the journal, its flush pending
    with pytest.raises(asyncio.CancelledError):
        await keeping

    [record] = recorder.journaled
    assert record.cost.total == Decimal("0.000018600")  # 100 x 0.15 + 8 x 0.45, per 1M
    assert admitted.cost == record.cost.total
    assert admitted.tokens == 108
