"""Dashboard figures, summed in SQL from the hourly rollups (``gateway.db.writer.rollups``).

A ``Scope`` is a period on whole UTC hours plus optional tenant and model filters. SQL
reduces the rollups to a few rows per price entry (and per hour for trends); Python adds
those exact Decimals and integers, and divides only for ratios shown to people.

Completed interactions are distinct, so they do not simply add up: the rollups count
(tenant, interaction, model, hour) cells, and the cells of interactions that completed in
more than one cell (flagged ``spans``) are fetched to subtract the repeats.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from gateway.db.models import InteractionCellRow, PriceRow, UsageHourRow
from gateway.db.writer.rollups import COMPLETED, UNPRICED
from pricing.cost import NANO, PER_MILLION, ZERO

K = TypeVar("K", bound=Hashable)
USAGE = UsageHourRow.__table__
CELLS = InteractionCellRow.__table__


@dataclass(frozen=True, slots=True)
class Scope:
    """Requests started in [lower, upper) (whole UTC hours) of these tenants and models.

    An empty filter means all.
    """

    lower: datetime
    upper: datetime
    tenant_ids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for moment in (self.lower, self.upper):
            if moment.tzinfo is None or (moment.minute, moment.second, moment.microsecond) != (
                0,
                0,
                0,
            ):
                raise ValueError(f"scope bounds are aware whole hours, got {moment!r}")

    def where(self, table: Any, *, tenants: bool = True) -> list[ColumnElement[bool]]:
        """The scope as conditions on a rollup table (with hour, tenant_id, model columns)."""
        conditions = [table.c.hour >= self.lower, table.c.hour < self.upper]
        if tenants and self.tenant_ids:
            conditions.append(table.c.tenant_id.in_(self.tenant_ids))
        if self.models:
            conditions.append(table.c.model.in_(self.models))
        return conditions


def ratio(part: int | Decimal, whole: int | Decimal) -> Decimal | None:
    """part / whole, or None when there is no whole."""
    return Decimal(part) / Decimal(whole) if whole else None


EXACT, APPROXIMATE, MIXED = "exact", "approximate", "partly approximate"


def ceiling_kind(ceiling_requests: int, exact_ceiling_requests: int) -> str | None:
    """How the ceilings of these requests were counted: in the replicas' own tokens (exact),
    from character blocks by a router with no tokenizer (approximate), or some of each;
    None when no request carries a ceiling."""
    if not ceiling_requests:
        return None
    if exact_ceiling_requests == ceiling_requests:
        return EXACT
    return APPROXIMATE if not exact_ceiling_requests else MIXED


@dataclass(frozen=True, slots=True)
class Figures:
    """Everything the overview shows for one scope (or one tenant, or one time bucket)."""

    requests: int = 0
    failed_requests: int = 0
    uncached_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    cost_uncached: Decimal = ZERO
    cost_cache_read: Decimal = ZERO
    cost_cache_write: Decimal = ZERO
    cost_output: Decimal = ZERO
    cost_total: Decimal = ZERO
    cost_uncached_equivalent: Decimal = ZERO
    # Cost of attempts that did not complete (failed, cancelled): retried or lost.
    cost_failed: Decimal = ZERO
    completed_interactions: int = 0
    ceiling_requests: int = 0
    ceiling_prompt_tokens: int = 0
    ceiling_cache_read_tokens: int = 0
    ceiling_cached_tokens: int = 0
    exact_ceiling_requests: int = 0
    avoidable_miss_tokens: int = 0
    # Avoidable miss tokens x (input - cache-read rate) of their price entry; exact.
    avoidable_miss_cost: Decimal = ZERO
    currency: str = "USD"

    @property
    def prompt_tokens(self) -> int:
        return self.uncached_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def hit_rate(self) -> Decimal | None:
        """Token hit rate: cache_read / prompt tokens."""
        return ratio(self.cache_read_tokens, self.prompt_tokens)

    @property
    def ceiling_rate(self) -> Decimal | None:
        """Hit-rate ceiling over the requests that carry one."""
        return ratio(self.ceiling_cached_tokens, self.ceiling_prompt_tokens)

    @property
    def routing_efficiency(self) -> Decimal | None:
        """Achieved / ceiling cached tokens, over the same requests: at most 1, since every
        request's stored ceiling is at least its reported cached tokens."""
        return ratio(self.ceiling_cache_read_tokens, self.ceiling_cached_tokens)

    @property
    def ceiling_kind(self) -> str | None:
        """exact, approximate or partly approximate (see ``ceiling_kind``); None: no ceiling."""
        return ceiling_kind(self.ceiling_requests, self.exact_ceiling_requests)

    @property
    def saved(self) -> Decimal:
        """What the cache saved: uncached equivalent minus actual."""
        return self.cost_uncached_equivalent - self.cost_total

    @property
    def cost_per_completed_interaction(self) -> Decimal | None:
        """All cost / completed interactions, to the nano-unit as in billing statements."""
        if not self.completed_interactions:
            return None
        return (self.cost_total / self.completed_interactions).quantize(NANO)

    @property
    def failed_cost_share(self) -> Decimal | None:
        return ratio(self.cost_failed, self.cost_total)


SUMMED = (
    "requests",
    "uncached_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "output_tokens",
    "cost_uncached",
    "cost_cache_read",
    "cost_cache_write",
    "cost_output",
    "cost_total",
    "cost_uncached_equivalent",
    "completed_cells",
    "ceiling_requests",
    "ceiling_prompt_tokens",
    "ceiling_cache_read_tokens",
    "ceiling_cached_tokens",
    "exact_ceiling_requests",
    "avoidable_miss_tokens",
)


@dataclass(frozen=True, slots=True)
class Rates:
    input: Decimal
    cache_read: Decimal
    currency: str


def _rates(session: Session, price_ids: set[str]) -> dict[str, Rates]:
    ids = sorted(price_ids - {UNPRICED})
    if not ids:
        return {}
    rows = session.execute(
        select(PriceRow.id, PriceRow.input, PriceRow.cache_read, PriceRow.currency).where(
            PriceRow.id.in_(ids)
        )
    )
    return {pid: Rates(rate_in, rate_read, currency) for pid, rate_in, rate_read, currency in rows}


def _fold(
    session: Session, scope: Scope, key: ColumnElement[Any] | None, group: Callable[[Any], K | None]
) -> dict[K, Figures]:
    """Usage rollups of the scope, grouped by ``group(key value)``; None drops a row."""
    keys = [key] if key is not None else []
    query = (
        select(
            *keys,
            USAGE.c.price_id,
            USAGE.c.status,
            *[func.sum(USAGE.c[name]).label(name) for name in SUMMED],
        )
        .where(*scope.where(USAGE))
        .group_by(*keys, USAGE.c.price_id, USAGE.c.status)
    )
    rows = session.execute(query).mappings().all()
    rates = _rates(session, {row["price_id"] for row in rows})
    sums: dict[K, dict[str, Any]] = {}
    currencies: dict[K, set[str]] = defaultdict(set)
    for row in rows:
        target = group(row[key.name] if key is not None else None)
        if target is None:
            continue
        into = sums.get(target)
        if into is None:
            into = sums[target] = {
                name: ZERO if name.startswith("cost") else 0
                for name in (*SUMMED, "failed_requests", "cost_failed", "avoidable_miss_cost")
            }
        for name in SUMMED:
            if row[name] is not None:
                into[name] += row[name]
        if row["status"] != COMPLETED:
            into["failed_requests"] += row["requests"]
            into["cost_failed"] += row["cost_total"]
        price = rates.get(row["price_id"])
        if price is not None:
            currencies[target].add(price.currency)
            into["avoidable_miss_cost"] += (
                row["avoidable_miss_tokens"] * (price.input - price.cache_read) / PER_MILLION
            )
    repeats = _repeats(session, scope, key, group)
    names = {f.name for f in fields(Figures)}
    return {
        target: Figures(
            **{name: value for name, value in values.items() if name in names},
            completed_interactions=values["completed_cells"] - repeats.get(target, 0),
            currency="/".join(sorted(currencies[target])) or "USD",
        )
        for target, values in sums.items()
    }


def _repeats(
    session: Session, scope: Scope, key: ColumnElement[Any] | None, group: Callable[[Any], K | None]
) -> dict[K, int]:
    """Per group: cells beyond the first of each interaction that has several there."""
    cell_key = [CELLS.c[key.name]] if key is not None else []
    query = (
        select(*cell_key, CELLS.c.tenant_id, CELLS.c.interaction_id, func.count())
        .where(CELLS.c.spans, *scope.where(CELLS))
        .group_by(*cell_key, CELLS.c.tenant_id, CELLS.c.interaction_id)
    )
    per_interaction: dict[tuple[K, str, str], int] = defaultdict(int)
    for row in session.execute(query):
        target = group(row[0] if key is not None else None)
        if target is not None:
            per_interaction[(target, row[-3], row[-2])] += row[-1]
    repeats: dict[K, int] = defaultdict(int)
    for (target, _tenant, _interaction), cells in per_interaction.items():
        repeats[target] += cells - 1
    return repeats


def totals(session: Session, scope: Scope) -> Figures:
    """The scope's figures."""
    return _fold(session, scope, None, lambda _: "all").get("all", Figures())


def by_tenant(session: Session, scope: Scope) -> dict[str, Figures]:
    """Figures per tenant id (tenants without requests in the scope are absent)."""
    return _fold(session, scope, USAGE.c.tenant_id, lambda tenant: str(tenant))


def bucketer(edges: Sequence[datetime]) -> Callable[[datetime], datetime | None]:
    """Map an hour to the start of its bucket [edges[i], edges[i+1]), or None outside."""

    def bucket(hour: datetime) -> datetime | None:
        index = bisect.bisect_right(edges, hour) - 1
        return edges[index] if 0 <= index < len(edges) - 1 else None

    return bucket


def trend(
    session: Session, scope: Scope, edges: Sequence[datetime]
) -> list[tuple[datetime, Figures]]:
    """Figures per time bucket; ``edges`` are ascending whole UTC hours, n+1 for n buckets.

    Buckets without requests are present with empty figures, so charts show the gaps.
    """
    folded = _fold(session, scope, USAGE.c.hour, bucketer(edges))
    return [(start, folded.get(start, Figures())) for start in edges[:-1]]


@dataclass(frozen=True, slots=True)
class PaidRate:
    """Blended input rate actually paid under one price entry, against its list input rate."""

    model: str
    price_id: str
    effective_from: datetime
    currency: str
    list_input_rate: Decimal
    list_cache_read_rate: Decimal
    requests: int
    prompt_tokens: int
    cache_read_tokens: int
    input_cost: Decimal

    @property
    def paid_input_rate(self) -> Decimal | None:
        """Input cost (uncached + cache read + cache write) per million prompt tokens."""
        if not self.prompt_tokens:
            return None
        return self.input_cost * PER_MILLION / self.prompt_tokens


def paid_rates(session: Session, scope: Scope) -> list[PaidRate]:
    """Per priced model x price entry in the scope, ordered by model and date."""
    query = (
        select(
            PriceRow.model,
            PriceRow.id,
            PriceRow.effective_from,
            PriceRow.currency,
            PriceRow.input,
            PriceRow.cache_read,
            func.sum(USAGE.c.requests),
            func.sum(
                USAGE.c.uncached_tokens + USAGE.c.cache_read_tokens + USAGE.c.cache_write_tokens
            ),
            func.sum(USAGE.c.cache_read_tokens),
            func.sum(USAGE.c.cost_uncached),
            func.sum(USAGE.c.cost_cache_read),
            func.sum(USAGE.c.cost_cache_write),
        )
        .join(PriceRow, PriceRow.id == USAGE.c.price_id)
        .where(*scope.where(USAGE))
        .group_by(
            PriceRow.model,
            PriceRow.id,
            PriceRow.effective_from,
            PriceRow.currency,
            PriceRow.input,
            PriceRow.cache_read,
        )
        .order_by(PriceRow.model, PriceRow.effective_from)
    )
    rates = []
    for row in session.execute(query):
        model, price_id, since, currency, rate_in, rate_read, n, prompt, read = row[:9]
        uncached, cache_read, cache_write = row[9:]
        rates.append(
            PaidRate(
                model=model,
                price_id=price_id,
                effective_from=since,
                currency=currency,
                list_input_rate=rate_in,
                list_cache_read_rate=rate_read,
                requests=int(n),
                prompt_tokens=int(prompt),
                cache_read_tokens=int(read),
                input_cost=(uncached or ZERO) + (cache_read or ZERO) + (cache_write or ZERO),
            )
        )
    return rates


@dataclass(frozen=True, slots=True)
class Unpriced:
    model: str
    requests: int
    prompt_tokens: int
    output_tokens: int


def unpriced(session: Session, scope: Scope) -> list[Unpriced]:
    """Requests in the scope that no price entry covered (they cost 0 in statements)."""
    query = (
        select(
            USAGE.c.model,
            func.sum(USAGE.c.requests),
            func.sum(
                USAGE.c.uncached_tokens + USAGE.c.cache_read_tokens + USAGE.c.cache_write_tokens
            ),
            func.sum(USAGE.c.output_tokens),
        )
        .where(USAGE.c.price_id == UNPRICED, *scope.where(USAGE))
        .group_by(USAGE.c.model)
        .order_by(USAGE.c.model)
    )
    return [Unpriced(m, int(n), int(p), int(o)) for m, n, p, o in session.execute(query)]


@dataclass(frozen=True, slots=True)
class CeilingRow:
    """Achieved token hit rate against the hit-rate ceiling, for one tenant and model."""

    tenant_id: str
    model: str
    figures: Figures


def achieved_vs_ceiling(session: Session, scope: Scope) -> list[CeilingRow]:
    """Per tenant and model: token hit rate, ceiling and routing efficiency (from rollups)."""
    from gateway.db.lookups import models as all_models

    rows: list[CeilingRow] = []
    for model in scope.models or tuple(all_models(session)):
        per_tenant = by_tenant(session, Scope(scope.lower, scope.upper, scope.tenant_ids, (model,)))
        rows.extend(
            CeilingRow(tenant, model, figures) for tenant, figures in sorted(per_tenant.items())
        )
    return rows
