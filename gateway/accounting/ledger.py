"""The ledger: the price book in force, and the one place an attempt becomes a Record.

Both request paths (vLLM replicas, litellm providers) hand their attempts here, so every
record is priced the same way: the entry for the model with the latest ``effective_from``
not after the attempt's start, per token class (and service tier, where one was reported).

An attempt is priced when its record is made, at its end, with the book held then. The
directory (gateway/directory.py) replaces the book whole as soon as a price is added, and
every request's key check runs the change check first (SQLite), so a price added before a
request started prices it, on whichever worker or gateway serves it.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from gateway.accounting.recorder import Recorder
from gateway.accounting.records import Record, Status
from gateway.auth import Principal
from gateway.metrics import Metrics
from gateway.usage import Usage
from pricing.book import Price, PriceBook
from pricing.cost import Cost, compute

log = logging.getLogger("kvgate.ledger")


class Ledger:
    """Prices attempts, and keeps their records (journal first, then metrics)."""

    def __init__(self, *, book: PriceBook, recorder: Recorder, metrics: Metrics) -> None:
        self.book = book  # replaced whole by the directory when the prices change
        self.recorder = recorder
        self.metrics = metrics
        self._unpriced_logged: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()

    def price_for(self, model: str, *, at: datetime) -> Price | None:
        price = self.book.price_for(model, at=at)
        if price is None and model not in self._unpriced_logged:
            self._unpriced_logged.add(model)
            log.warning("no price in force for model %r: its requests are recorded unpriced", model)
        return price

    def record(
        self,
        *,
        request_id: str,
        attempt: int,
        principal: Principal,
        interaction_id: str,
        deployment: str,
        bills_as: str,
        upstream: str,
        policy: str,
        stream: bool,
        started_at: datetime,
        status: Status,
        usage: Usage,
        first_token_at: datetime | None = None,
        finish_reason: str | None = None,
        error: str | None = None,
        service_tier: str | None = None,
        predicted_cached_tokens: int | None = None,
        ceiling_cached_tokens: int | None = None,
    ) -> Record:
        """One attempt, priced with the entry in force at its start."""
        price = self.price_for(bills_as, at=started_at)
        return Record(
            request_id=request_id,
            tenant_id=principal.tenant_id,
            api_key_id=principal.api_key_id,
            interaction_id=interaction_id,
            attempt=attempt,
            model=deployment,
            deployment=deployment,
            upstream=upstream,
            policy=policy,
            started_at=started_at,
            first_token_at=first_token_at,
            ended_at=datetime.now(UTC),
            status=status,
            finish_reason=finish_reason,
            usage=usage,
            price_id=price.id if price else None,
            rate_class=price.rate_class(usage.prompt_tokens, service_tier) if price else None,
            cost=compute(usage, price, tier=service_tier) if price else Cost(),
            stream=stream,
            error=error,
            predicted_cached_tokens=predicted_cached_tokens,
            ceiling_cached_tokens=ceiling_cached_tokens,
            extra={"service_tier": service_tier} if service_tier else {},
        )

    async def keep(self, record: Record) -> None:
        """Durable in the journal, then counted."""
        await self.recorder.record(record)
        self.metrics.observe(record)

    def keep_later(self, record: Record) -> None:
        """Keep from a cancelled task, where awaiting is no longer possible."""
        task = asyncio.ensure_future(self.keep(record))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
