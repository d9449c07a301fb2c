"""Figures per price entry, from the hourly rollups: the blended rate paid under each, and
the traffic no entry covered."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db import sums
from gateway.db.figures.spend import USAGE, Scope
from gateway.db.models import PriceRow
from gateway.db.sums import Sums
from gateway.db.writer.rollups import UNPRICED
from pricing.cost import PER_MILLION


@dataclass(frozen=True, slots=True)
class PaidRate:
    """Blended input rate actually paid under one price entry, against its list input rate."""

    model: str
    price_id: str
    effective_from: datetime
    currency: str
    list_input_rate: Decimal
    list_cache_read_rate: Decimal
    sums: Sums

    @property
    def input_cost(self) -> Decimal:
        """Uncached + cache read + cache write."""
        return self.sums.cost_uncached + self.sums.cost_cache_read + self.sums.cost_cache_write

    @property
    def paid_input_rate(self) -> Decimal | None:
        """Input cost per million prompt tokens."""
        if not self.sums.prompt_tokens:
            return None
        return self.input_cost * PER_MILLION / self.sums.prompt_tokens


def paid_rates(session: Session, scope: Scope) -> list[PaidRate]:
    """Per priced model x price entry in the scope, ordered by model and date."""
    entry = (
        PriceRow.model,
        PriceRow.id,
        PriceRow.effective_from,
        PriceRow.currency,
        PriceRow.input,
        PriceRow.cache_read,
    )
    query = (
        select(*entry, *sums.columns(USAGE))
        .join(PriceRow, PriceRow.id == USAGE.c.price_id)
        .where(*scope.where(USAGE))
        .group_by(*entry)
        .order_by(PriceRow.model, PriceRow.effective_from)
    )
    return [
        PaidRate(
            model=row["model"],
            price_id=row["id"],
            effective_from=row["effective_from"],
            currency=row["currency"],
            list_input_rate=row["input"],
            list_cache_read_rate=row["cache_read"],
            sums=sums.from_row(row),
        )
        for row in session.execute(query).mappings()
    ]


@dataclass(frozen=True, slots=True)
class Unpriced:
    """A model's attempts that no price entry covered: their cost is unknown, not 0."""

    model: str
    sums: Sums


def unpriced(session: Session, scope: Scope) -> list[Unpriced]:
    """Attempts in the scope that no price entry covered, per model."""
    query = (
        select(USAGE.c.model, *sums.columns(USAGE))
        .where(USAGE.c.price_id == UNPRICED, *scope.where(USAGE))
        .group_by(USAGE.c.model)
        .order_by(USAGE.c.model)
    )
    return [Unpriced(row["model"], sums.from_row(row)) for row in session.execute(query).mappings()]
