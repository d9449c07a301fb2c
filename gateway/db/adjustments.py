"""Price corrections: what a wrong price entry billed, what it should have, and the
adjustments that make up the difference, written beside the records and never over them.

A correction names a stored entry and its corrected base rates; the entry's 1-hour write,
long-context and tier rates stay as the entry has them. Each request the entry priced is
priced again by ``pricing.cost`` at the corrected rates of the rate set it was billed
with (so the same per-class nano-unit rounding applies), and the requests are summed per
tenant × UTC day × model. An adjustment is the corrected cost less what is billed: the
requests' stored costs plus the adjustments already made to them, so applying the same
correction again adjusts nothing, and a different one adjusts relative to the last.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import orjson
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gateway.db.crud import price_from_row
from gateway.db.models import PriceAdjustmentRow, PriceRow, RequestRow
from gateway.db.statements import prices_by_id
from gateway.db.sums import Sums
from gateway.errors import NotFound
from pricing.book import Price, Rates
from pricing.cost import ZERO, cost_at

BATCH = 5000  # requests read at a time while pricing them again


@dataclass(frozen=True, slots=True)
class Correction:
    """A stored entry and the base rates it should have had, with who corrects it and why."""

    entry: Price
    rates: Rates  # the corrected base rates
    reason: str
    by: str

    @property
    def corrected(self) -> Price:
        """The entry with its base rates corrected (long-context and tier rates kept)."""
        return replace(
            self.entry,
            input=self.rates.input,
            cache_read=self.rates.cache_read,
            cache_write=self.rates.cache_write,
            cache_write_1h=self.rates.cache_write_1h,
            output=self.rates.output,
        )

    @property
    def key(self) -> str:
        """The correction's identity: the entry and its corrected rates, however written."""
        document = {"entry": self.entry.id, "rates": self.shown()}
        text = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(text).hexdigest()

    def shown(self) -> dict[str, str]:
        """The corrected base rates that are set, by name, as exact decimal strings without
        trailing zeros (``0.25`` whether it was given so or stored as ``0.250000000``)."""
        return {
            name: f"{Decimal(rate).normalize():f}" for name, rate in self.rates.to_mapping().items()
        }


def correction(
    entry: Price,
    *,
    input: Decimal,
    cache_read: Decimal,
    cache_write: Decimal | None,
    output: Decimal | None,
    reason: str,
    by: str,
) -> Correction:
    """A correction of ``entry``'s base rates; a rate not given keeps the entry's."""
    rates = Rates(
        input=input,
        cache_read=cache_read,
        output=entry.output if output is None else output,
        cache_write=entry.cache_write if cache_write is None else cache_write,
        cache_write_1h=entry.cache_write_1h,
    )
    return Correction(entry=entry, rates=rates, reason=reason, by=by)


@dataclass(frozen=True, slots=True)
class Line:
    """One tenant's requests of one UTC day and model that the entry priced."""

    tenant_id: str
    day: date
    model: str
    requests: int
    recorded: Decimal  # the requests' stored costs
    adjusted: Decimal  # the adjustments already made to them
    corrected: Decimal  # their cost at the corrected rates

    @property
    def billed(self) -> Decimal:
        """What the requests are billed now: stored costs and earlier adjustments."""
        return self.recorded + self.adjusted

    @property
    def delta(self) -> Decimal:
        """What an adjustment adds (negative: gives back) to bill the corrected cost."""
        return self.corrected - self.billed


def entry(session: Session, price_id: str) -> Price:
    """The stored price entry ``price_id``; NotFound if there is none."""
    row = None if "\x00" in price_id else session.get(PriceRow, price_id)
    if row is None:
        raise NotFound(f"no price entry {price_id!r} (`kvgate prices list` shows them)")
    return price_from_row(row)


def plan(session: Session, fix: Correction) -> list[Line]:
    """Per tenant × UTC day × model (in that order): what the entry's requests are billed,
    and what the corrected rates make of them."""
    corrected = fix.corrected
    totals: dict[tuple[str, date, str], tuple[int, Decimal, Decimal]] = {}
    query = (
        select(
            RequestRow.tenant_id,
            RequestRow.started_at,
            RequestRow.model,
            RequestRow.rate_class,
            RequestRow.service_tier,
            RequestRow.uncached_tokens,
            RequestRow.cache_read_tokens,
            RequestRow.cache_write_tokens,
            RequestRow.cache_write_1h_tokens,
            RequestRow.output_tokens,
            RequestRow.cost_total,
        )
        .where(RequestRow.price_id == fix.entry.id)
        .execution_options(yield_per=BATCH)
    )
    for row in session.execute(query):
        tokens = Sums(
            requests=1,
            uncached_tokens=row.uncached_tokens,
            cache_read_tokens=row.cache_read_tokens,
            cache_write_tokens=row.cache_write_tokens,
            cache_write_1h_tokens=row.cache_write_1h_tokens,
            output_tokens=row.output_tokens,
        )
        # The rate set the request was billed with; before kvgate kept it, the one its
        # tokens and tier choose (as the ledger chose then).
        rate_class = row.rate_class or fix.entry.rate_class(tokens.prompt_tokens, row.service_tier)
        cost = cost_at(tokens, corrected.rates_named(rate_class)).total
        cell = (row.tenant_id, row.started_at.astimezone(UTC).date(), row.model)
        requests, recorded, total = totals.get(cell, (0, ZERO, ZERO))
        totals[cell] = (requests + 1, recorded + row.cost_total, total + cost)
    adjusted = _adjusted(session, fix.entry.id)
    return [
        Line(
            tenant_id=tenant_id,
            day=day,
            model=model,
            requests=requests,
            recorded=recorded,
            adjusted=adjusted.get((tenant_id, day, model), ZERO),
            corrected=total,
        )
        for (tenant_id, day, model), (requests, recorded, total) in sorted(totals.items())
    ]


def _adjusted(session: Session, price_id: str) -> dict[tuple[str, date, str], Decimal]:
    rows = session.execute(
        select(
            PriceAdjustmentRow.tenant_id,
            PriceAdjustmentRow.day,
            PriceAdjustmentRow.model,
            func.sum(PriceAdjustmentRow.delta),
        )
        .where(PriceAdjustmentRow.price_id == price_id)
        .group_by(PriceAdjustmentRow.tenant_id, PriceAdjustmentRow.day, PriceAdjustmentRow.model)
    )
    return {(tenant, day, model): delta for tenant, day, model, delta in rows}


def apply(session: Session, fix: Correction, *, now: datetime | None = None) -> list[Line]:
    """Write an adjustment for every line the correction changes; returns every line of
    the plan (those whose delta is 0 are left as they are).

    The entry's row is written to first, which holds every other correction of it until
    this transaction ends (a row lock on Postgres, the write lock on SQLite), so two
    corrections never both adjust from the same billed amounts.
    """
    session.execute(update(PriceRow).where(PriceRow.id == fix.entry.id).values(id=PriceRow.id))
    moment = now or datetime.now(UTC)
    rates = orjson.dumps(fix.shown()).decode()
    lines = plan(session, fix)
    session.add_all(
        PriceAdjustmentRow(
            id="adj_" + secrets.token_hex(8),
            correction_key=fix.key,
            price_id=fix.entry.id,
            tenant_id=line.tenant_id,
            day=line.day,
            model=line.model,
            requests=line.requests,
            billed=line.billed,
            corrected=line.corrected,
            delta=line.delta,
            corrected_rates=rates,
            reason=fix.reason,
            created_by=fix.by,
            created_at=moment,
        )
        for line in lines
        if line.delta != 0
    )
    session.flush()
    return lines


def applied_before(session: Session, fix: Correction) -> int:
    """How many adjustments this same correction (its key) has written already."""
    found = session.scalar(
        select(func.count())
        .select_from(PriceAdjustmentRow)
        .where(PriceAdjustmentRow.correction_key == fix.key)
    )
    return int(found or 0)


@dataclass(frozen=True, slots=True)
class Adjustment:
    """One stored adjustment, as a statement shows it."""

    id: str
    price_id: str
    day: date
    model: str
    requests: int
    billed: Decimal
    corrected: Decimal
    delta: Decimal
    corrected_rates: dict[str, str]
    reason: str
    by: str
    created_at: datetime
    correction_key: str
    currency: str | None  # the entry's (None: the entry is gone)


def for_tenant(session: Session, *, tenant_id: str, start: date, end: date) -> list[Adjustment]:
    """A tenant's adjustments to the UTC days start..end (both included), oldest day first."""
    rows = session.scalars(
        select(PriceAdjustmentRow)
        .where(
            PriceAdjustmentRow.tenant_id == tenant_id,
            PriceAdjustmentRow.day >= start,
            PriceAdjustmentRow.day <= end,
        )
        .order_by(
            PriceAdjustmentRow.day,
            PriceAdjustmentRow.model,
            PriceAdjustmentRow.price_id,
            PriceAdjustmentRow.created_at,
            PriceAdjustmentRow.id,
        )
    )
    found = list(rows)
    prices = prices_by_id(session, {row.price_id for row in found})
    return [_adjustment(row, prices.get(row.price_id)) for row in found]


def _adjustment(row: PriceAdjustmentRow, price: Price | None) -> Adjustment:
    return Adjustment(
        id=row.id,
        price_id=row.price_id,
        day=row.day,
        model=row.model,
        requests=row.requests,
        billed=row.billed,
        corrected=row.corrected,
        delta=row.delta,
        corrected_rates=orjson.loads(row.corrected_rates),
        reason=row.reason,
        by=row.created_by,
        created_at=row.created_at,
        correction_key=row.correction_key,
        currency=price.currency if price is not None else None,
    )


def adjusted_days(
    session: Session,
    *,
    lower: datetime,
    upper: datetime,
    tenant_ids: Iterable[str] = (),
    models: Iterable[str] = (),
) -> list[tuple[date, Decimal]]:
    """The UTC days touching [lower, upper) that have adjustments (of these tenants and
    models; empty: all), with the adjustments' sum on each."""
    last = (upper - timedelta(microseconds=1)).astimezone(UTC).date()
    query = (
        select(PriceAdjustmentRow.day, func.sum(PriceAdjustmentRow.delta))
        .where(
            PriceAdjustmentRow.day >= lower.astimezone(UTC).date(),
            PriceAdjustmentRow.day <= last,
        )
        .group_by(PriceAdjustmentRow.day)
        .order_by(PriceAdjustmentRow.day)
    )
    tenants, names = tuple(tenant_ids), tuple(models)
    if tenants:
        query = query.where(PriceAdjustmentRow.tenant_id.in_(tenants))
    if names:
        query = query.where(PriceAdjustmentRow.model.in_(names))
    return [(day, delta) for day, delta in session.execute(query)]
