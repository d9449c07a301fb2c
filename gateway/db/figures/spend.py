"""Dashboard figures, summed in SQL from the hourly rollups (``gateway.db.writer.rollups``).

A ``Scope`` is a period on whole UTC hours plus optional tenant and model filters. SQL
reduces the rollups to a few rows per price entry (and per hour for trends); Python adds
those exact Decimals and integers, and divides only for ratios shown to people.

Completed interactions are distinct, so they do not simply add up: the rollups count
(tenant, interaction, model, hour) cells, and the cells of interactions that completed in
more than one cell (flagged ``spans``) are fetched to subtract the repeats. Interactions a
priced attempt completed are counted the same way over the cells flagged ``priced``: cost
per completed interaction divides by those (as statements do, ``gateway.billing``).

Every figure of tokens and money is a ``gateway.db.sums.Sums``, summed by its expressions.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, case, func, null, select
from sqlalchemy.orm import Session

from gateway.db import sums
from gateway.db.models import InteractionCellRow, PriceRow, UsageHourRow
from gateway.db.sums import Sums
from gateway.db.writer.rollups import COMPLETED, UNPRICED
from pricing.cost import NANO, PER_MILLION, ZERO

REFUSED = "refused"  # ``gateway.accounting.records.Status.REFUSED``
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


CEILINGS = (
    "ceiling_requests",
    "ceiling_prompt_tokens",
    "ceiling_cache_read_tokens",
    "ceiling_cached_tokens",
    "exact_ceiling_requests",
)


@dataclass(frozen=True, slots=True)
class Ceilings:
    """The requests that carry a hit-rate ceiling, and their tokens, so that efficiency
    compares like with like: summed alike by the usage and the replica rollups."""

    ceiling_requests: int = 0
    ceiling_prompt_tokens: int = 0
    ceiling_cache_read_tokens: int = 0
    ceiling_cached_tokens: int = 0
    exact_ceiling_requests: int = 0

    @property
    def achieved_rate(self) -> Decimal | None:
        """Hit rate over the requests that carry a ceiling."""
        return ratio(self.ceiling_cache_read_tokens, self.ceiling_prompt_tokens)

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


@dataclass(frozen=True, slots=True)
class Figures(Ceilings):
    """Everything the overview shows for one scope (or one tenant, or one time bucket).

    ``sums`` covers every attempt; ``unpriced`` the attempts no price entry covered (their
    stored cost is 0, so money sums are of priced attempts); ``failed`` the attempts that
    did not complete (failed, cancelled: retried or lost); ``refused`` the requests turned
    away at admission by a budget or a rate limit (the client's own limits, no upstream
    called, no cost): they are not failures.
    """

    sums: Sums = field(default_factory=Sums)
    unpriced: Sums = field(default_factory=Sums)
    failed: Sums = field(default_factory=Sums)
    refused: Sums = field(default_factory=Sums)
    completed_interactions: int = 0
    # Completed interactions a priced attempt completed (``gateway.billing.Totals``).
    priced_completed_interactions: int = 0
    avoidable_miss_tokens: int = 0
    # Avoidable miss tokens x (input - cache-read rate) of their price entry; exact.
    avoidable_miss_cost: Decimal = ZERO
    currency: str | None = None  # of the priced attempts; None when none was priced

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of every class: uncached, cache read and cache write."""
        return self.sums.prompt_tokens

    @property
    def hit_rate(self) -> Decimal | None:
        """Token hit rate: cache_read / prompt tokens."""
        return ratio(self.sums.cache_read_tokens, self.sums.prompt_tokens)

    @property
    def saved(self) -> Decimal:
        """What the cache saved: uncached equivalent minus actual."""
        return self.sums.cost_uncached_equivalent - self.sums.cost_total

    @property
    def unpriced_completed_interactions(self) -> int:
        """Completed interactions that no priced attempt completed."""
        return self.completed_interactions - self.priced_completed_interactions

    @property
    def cost_per_completed_interaction(self) -> Decimal | None:
        """Cost of priced attempts / completed interactions a priced attempt completed, to
        the nano-unit as in billing statements."""
        if not self.priced_completed_interactions:
            return None
        return (self.sums.cost_total / self.priced_completed_interactions).quantize(NANO)

    @property
    def unpriced_interaction_share(self) -> Decimal | None:
        """Completed interactions no priced attempt completed / all completed ones."""
        return ratio(self.unpriced_completed_interactions, self.completed_interactions)

    @property
    def failed_cost_share(self) -> Decimal | None:
        """Spend on attempts that did not complete / all spend."""
        return ratio(self.failed.cost_total, self.sums.cost_total)

    @property
    def admitted(self) -> int:
        """Attempts admitted (every attempt but those refused at admission)."""
        return self.sums.requests - self.refused.requests

    @property
    def failure_rate(self) -> Decimal | None:
        """Admitted attempts that did not complete (failed, cancelled) / admitted attempts.

        Refusals by a budget or a rate limit are the client's limits at work, not failures:
        they count on neither side.
        """
        return ratio(self.failed.requests, self.admitted)


# Rollup columns summed beside the Sums: figures of their own.
EXTRA = (
    "completed_cells",
    "priced_completed_cells",
    *CEILINGS,
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
    session: Session,
    scope: Scope,
    key: ColumnElement[Any] | None,
    group: Callable[[Any], K | None],
    edges: Sequence[datetime] | None = None,
) -> dict[K, Figures]:
    """Usage rollups of the scope, grouped by ``group(key value)``; None drops a row.
    A key of hours' buckets (``bucket_index``) comes with its ``edges``."""
    keys = [key] if key is not None else []
    query = (
        select(
            *keys,
            USAGE.c.price_id,
            USAGE.c.status,
            *sums.columns(USAGE),
            *[func.sum(USAGE.c[name]).label(name) for name in EXTRA],
        )
        .where(*scope.where(USAGE))
        .group_by(*keys, USAGE.c.price_id, USAGE.c.status)
    )
    rows = session.execute(query).mappings().all()
    rates = _rates(session, {row["price_id"] for row in rows})
    into: dict[K, dict[str, Any]] = {}
    currencies: dict[K, set[str]] = defaultdict(set)
    for row in rows:
        target = group(row[key.name] if key is not None else None)
        if target is None:
            continue
        values = into.get(target)
        if values is None:
            values = into[target] = {
                "sums": Sums(),
                "unpriced": Sums(),
                "failed": Sums(),
                "refused": Sums(),
                "avoidable_miss_cost": ZERO,
                **dict.fromkeys(EXTRA, 0),
            }
        found = sums.from_row(row)
        values["sums"] += found
        if row["price_id"] == UNPRICED:
            values["unpriced"] += found
        if row["status"] == REFUSED:
            values["refused"] += found
        elif row["status"] != COMPLETED:
            values["failed"] += found
        for name in EXTRA:
            values[name] += int(row[name] or 0)
        price = rates.get(row["price_id"])
        if price is not None:
            currencies[target].add(price.currency)
            values["avoidable_miss_cost"] += (
                int(row["avoidable_miss_tokens"] or 0)
                * (price.input - price.cache_read)
                / PER_MILLION
            )
    repeats = _repeats(session, scope, key, group, edges)
    return {
        target: Figures(
            sums=values["sums"],
            unpriced=values["unpriced"],
            failed=values["failed"],
            refused=values["refused"],
            completed_interactions=values["completed_cells"] - repeats[target].cells,
            priced_completed_interactions=(
                values["priced_completed_cells"] - repeats[target].priced
            ),
            **{name: values[name] for name in CEILINGS},
            avoidable_miss_tokens=values["avoidable_miss_tokens"],
            avoidable_miss_cost=values["avoidable_miss_cost"],
            currency="/".join(sorted(currencies[target])) or None,
        )
        for target, values in into.items()
    }


@dataclass(slots=True)
class Repeats:
    """Cells beyond the first of interactions with several in a group: all, and priced."""

    cells: int = 0
    priced: int = 0


def _repeats(
    session: Session,
    scope: Scope,
    key: ColumnElement[Any] | None,
    group: Callable[[Any], K | None],
    edges: Sequence[datetime] | None = None,
) -> defaultdict[K, Repeats]:
    """Per group: cells beyond the first of each interaction that has several there.

    Counted in SQL, a few rows a group: a spanning interaction is a row of the inner
    grouping only, never fetched (at 10,000,000 records they are some 200,000 in a month).
    With ``edges`` the cells are grouped by their hour's bucket (``bucket_index``, what
    ``group`` then maps), so that an interaction with cells in two hours of one bucket
    counts once there.
    """
    targets: list[ColumnElement[Any]] = []
    if edges is not None:
        targets = [bucket_index(CELLS.c.hour, edges).label("target")]
    elif key is not None:
        targets = [CELLS.c[key.name].label("target")]
    per_interaction = (
        select(
            *targets,
            func.count().label("cells"),
            func.sum(case((CELLS.c.priced, 1), else_=0)).label("priced"),
        )
        .where(CELLS.c.spans, *scope.where(CELLS))
        .group_by(*targets, CELLS.c.tenant_id, CELLS.c.interaction_id)
        .subquery()
    )
    by_target = [per_interaction.c.target] if targets else []
    query = select(
        *by_target,
        func.sum(per_interaction.c.cells - 1),
        func.sum(case((per_interaction.c.priced > 1, per_interaction.c.priced - 1), else_=0)),
    ).group_by(*by_target)
    repeats: defaultdict[K, Repeats] = defaultdict(Repeats)
    for row in session.execute(query):
        target = group(row[0] if targets else None)
        if target is not None:
            repeats[target].cells += int(row[-2] or 0)
            repeats[target].priced += int(row[-1] or 0)
    return repeats


def completed(session: Session, scope: Scope) -> tuple[int, int]:
    """The scope's completed interactions, and those a priced attempt completed: what
    ``totals`` counts, without the rest of its figures."""
    cells, priced = session.execute(
        select(func.sum(USAGE.c.completed_cells), func.sum(USAGE.c.priced_completed_cells)).where(
            *scope.where(USAGE)
        )
    ).one()
    repeats = _repeats(session, scope, None, lambda _: "all")["all"]
    return int(cells or 0) - repeats.cells, int(priced or 0) - repeats.priced


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


def bucket_index(column: ColumnElement[Any], edges: Sequence[datetime]) -> ColumnElement[Any]:
    """In SQL, the index i of the bucket [edges[i], edges[i+1]) holding the hour in
    ``column``; NULL outside the edges."""
    inside = [(column < edge, n) for n, edge in enumerate(edges[1:])]
    return case((column < edges[0], null()), *inside, else_=null())


def trend(
    session: Session, scope: Scope, edges: Sequence[datetime]
) -> list[tuple[datetime, Figures]]:
    """Figures per time bucket; ``edges`` are ascending whole UTC hours, n+1 for n buckets.

    Buckets without requests are present with empty figures, so charts show the gaps.
    """
    # The hours are put in their buckets in SQL: a few rows per bucket come back.
    index = bucket_index(USAGE.c.hour, edges).label("bucket")
    folded = _fold(session, scope, index, lambda n: None if n is None else int(n), edges)
    return [(start, folded.get(n, Figures())) for n, start in enumerate(edges[:-1])]


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
