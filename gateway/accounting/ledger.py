"""The ledger: the price book in force, and where records are kept.

Every request path prices its attempts here, so every record is priced the same way: the
entry for the model with the latest ``effective_from`` not after the attempt's start, per
token class (and service tier, where one was reported). Kept records are journaled first,
then shown to the observers (the metrics) once the answer has gone: they run on the
event loop's next turn, after the response is written, not on the request's latency.

An attempt is priced when its record is made, at its end, with the book held then. The
directory (gateway/directory/) replaces the book whole as soon as a price is added, and
every request's key check runs the change check first (SQLite), so a price added before a
request started prices it, on whichever worker or gateway serves it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from gateway.accounting.recorder import Recorder
from gateway.accounting.records import Record
from gateway.usage import Usage
from pricing.book import Price, PriceBook
from pricing.cost import Cost, compute

log = logging.getLogger("kvgate.ledger")


@dataclass(frozen=True, slots=True)
class Priced:
    """An attempt's price: the entry used (None when the model has none), its rate set and
    the cost per token class."""

    price_id: str | None
    rate_class: str | None
    cost: Cost


UNPRICED = Priced(price_id=None, rate_class=None, cost=Cost())


class Ledger:
    """Prices attempts, and keeps their records (journal first, then the observers)."""

    def __init__(
        self,
        *,
        book: PriceBook,
        recorder: Recorder,
        observers: Iterable[Callable[[Record], None]] = (),
    ) -> None:
        self.book = book  # replaced whole by the directory when the prices change
        self.recorder = recorder
        self.observers = tuple(observers)
        self._unpriced_logged: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()

    def price_for(self, model: str, *, at: datetime) -> Price | None:
        """The entry in force for ``model`` at ``at``; a model without one is logged once."""
        price = self.book.price_for(model, at=at)
        if price is None and model not in self._unpriced_logged:
            self._unpriced_logged.add(model)
            log.warning("no price in force for model %r: its requests are recorded unpriced", model)
        return price

    def price(self, model: str, *, at: datetime, usage: Usage, tier: str | None) -> Priced:
        """What ``usage`` of ``model`` cost when started at ``at``, in the tier reported."""
        price = self.price_for(model, at=at)
        if price is None:
            return UNPRICED
        return Priced(
            price_id=price.id,
            rate_class=price.rate_class(usage.prompt_tokens, tier),
            cost=compute(usage, price, tier=tier),
        )

    async def keep(self, record: Record) -> None:
        """Durable in the journal; observed on the loop's next turn (the answer, written
        in this turn, does not wait for the metrics)."""
        await self.recorder.record(record)
        if self.observers:
            asyncio.get_running_loop().call_soon(self._observe, record)

    def _observe(self, record: Record) -> None:
        """Show a kept record to every observer; one that fails is logged, not raised."""
        for observe in self.observers:
            try:
                observe(record)
            except Exception:
                log.exception("observer %r failed on record %s", observe, record.request_id)

    def keep_later(self, record: Record) -> None:
        """Keep from a cancelled task, where awaiting is no longer possible."""
        task = asyncio.ensure_future(self.keep(record))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
