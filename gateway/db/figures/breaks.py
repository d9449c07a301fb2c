"""Prefix breakers: where prompts leave their interaction's previous request, ranked, and
what that cost, summed in SQL from the ``break_hours`` rollup.

    lost_usd = lost tokens × (input rate - cache-read rate) of each request's own price
               entry and rate set (the price the request was billed with), rounded to the
               nano-dollar per entry and rate set, then added

Unpriced requests count in requests and tokens, not in money (their ``unpriced`` count says
how many). A position is early when it lies in the first tenth of the prompt or its first
two blocks (``gateway.routing.breaks``); the same offset can be early for short prompts and
late for long ones, and is then two positions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.db.crud import price_from_row
from gateway.db.figures.spend import Scope
from gateway.db.models import BreakHourRow, PriceRow, RequestRow
from pricing.book import Rates
from pricing.cost import ZERO, money

BREAKS = BreakHourRow.__table__
CONTEXTS_READ = 10_000  # the latest kept contexts looked at for examples


@dataclass(frozen=True, slots=True)
class Position:
    """One break position of one tenant and model: how often, and what it cost."""

    tenant_id: str
    model: str
    break_tokens: int
    early: bool
    requests: int
    lost_tokens: int
    prompt_tokens: int  # of the requests that broke here
    lost_usd: Decimal  # of the priced ones
    unpriced: int  # requests with no price entry (no money counted)
    currency: str | None
    # The latest text kept around a break here (tenants that opted in), else None.
    context: dict[str, Any] | None = None


Key = tuple[str, str, int, bool]
# What a position is grouped by: tenant, model, offset, early, and the price it was under.
POSITION = (
    BREAKS.c.tenant_id,
    BREAKS.c.model,
    BREAKS.c.break_tokens,
    BREAKS.c.early,
    BREAKS.c.price_id,
    BREAKS.c.rate_class,
)


def positions(session: Session, scope: Scope, *, contexts: bool = True) -> list[Position]:
    """Per tenant and model, its break positions, most tokens lost first."""
    query = (
        select(
            *POSITION,
            func.sum(BREAKS.c.requests),
            func.sum(BREAKS.c.lost_tokens),
            func.sum(BREAKS.c.prompt_tokens),
        )
        .where(*scope.where(BREAKS))
        .group_by(*POSITION)
    )
    rows = session.execute(query).all()
    rates = _rates(session, {row[4] for row in rows})
    into: dict[Key, dict[str, Any]] = {}
    for tenant, model, offset, early, price_id, rate_class, requests, lost, prompt in rows:
        values = into.setdefault(
            (tenant, model, int(offset), bool(early)),
            {"requests": 0, "lost": 0, "prompt": 0, "usd": ZERO, "unpriced": 0, "cur": set()},
        )
        values["requests"] += int(requests)
        values["lost"] += int(lost)
        values["prompt"] += int(prompt)
        found = rates.get(price_id)
        if found is None:
            values["unpriced"] += int(requests)
            continue
        entry, currency = found
        chosen = entry(rate_class)
        values["usd"] += money(int(lost), chosen.input - chosen.cache_read)
        values["cur"].add(currency)
    examples = _examples(session, scope) if contexts else {}
    ranked = [
        Position(
            tenant_id=tenant,
            model=model,
            break_tokens=offset,
            early=early,
            requests=v["requests"],
            lost_tokens=v["lost"],
            prompt_tokens=v["prompt"],
            lost_usd=v["usd"],
            unpriced=v["unpriced"],
            currency="/".join(sorted(v["cur"])) or None,
            context=examples.get((tenant, model, offset, early)),
        )
        for (tenant, model, offset, early), v in into.items()
    ]
    ranked.sort(key=lambda p: (p.tenant_id, p.model, -p.lost_tokens, p.break_tokens, p.early))
    return ranked


@dataclass(frozen=True, slots=True)
class Lost:
    """What prefix breaks cost over a scope (beside "saved by the cache")."""

    requests: int = 0
    lost_tokens: int = 0
    early_requests: int = 0
    lost_usd: Decimal = ZERO


def lost(session: Session, scope: Scope) -> Lost:
    """The scope's breaks, summed: requests, tokens not reused, and their cost."""
    found = positions(session, scope, contexts=False)
    return Lost(
        requests=sum(p.requests for p in found),
        lost_tokens=sum(p.lost_tokens for p in found),
        early_requests=sum(p.requests for p in found if p.early),
        lost_usd=sum((p.lost_usd for p in found), ZERO),
    )


def _rates(session: Session, price_ids: Iterable[str]) -> dict[str, tuple[Any, str]]:
    """Per price id: its rate sets by name, and its currency."""
    ids = sorted({pid for pid in price_ids if pid})
    if not ids:
        return {}
    out: dict[str, tuple[Any, str]] = {}
    for row in session.scalars(select(PriceRow).where(PriceRow.id.in_(ids))):
        entry = price_from_row(row)

        def rates_of(rate_class: str, entry: Any = entry) -> Rates:
            return entry.rates_named(rate_class or "standard")  # type: ignore[no-any-return]

        out[row.id] = (rates_of, row.currency)
    return out


def _examples(session: Session, scope: Scope) -> dict[Key, dict[str, Any]]:
    """The latest kept context per position (requests of tenants that opted in)."""
    requests = RequestRow.__table__
    conditions = [
        requests.c.break_context.is_not(None),
        requests.c.started_at >= scope.lower,
        requests.c.started_at < scope.upper,
    ]
    if scope.tenant_ids:
        conditions.append(requests.c.tenant_id.in_(scope.tenant_ids))
    if scope.models:
        conditions.append(requests.c.model.in_(scope.models))
    query = (
        select(
            requests.c.tenant_id,
            requests.c.model,
            requests.c.break_tokens,
            requests.c.break_early,
            requests.c.started_at,
            requests.c.break_context,
        )
        .where(*conditions)
        .order_by(requests.c.started_at.desc())
        .limit(CONTEXTS_READ)
    )
    examples: dict[Key, dict[str, Any]] = {}
    for tenant, model, offset, early, started, context in session.execute(query):
        key = (tenant, model, int(offset), bool(early))
        if key not in examples:
            examples[key] = {**orjson.loads(context), "at": _iso(started)}
    return examples


def document(position: Position, tenant: str) -> dict[str, Any]:
    """A position as ``kvgate breakers --format json`` and the billing API write it."""
    out: dict[str, Any] = {
        "tenant": tenant,
        "model": position.model,
        "break_tokens": position.break_tokens,
        "requests": position.requests,
        "lost_tokens": position.lost_tokens,
        "lost_usd": str(position.lost_usd),
        "early": position.early,
    }
    if position.unpriced:
        out["unpriced_requests"] = position.unpriced
    if position.context is not None:
        out["context"] = position.context
    return out


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def by_tenant(found: Iterable[Position]) -> dict[str, list[Position]]:
    """Positions grouped per tenant, in rank order."""
    grouped: dict[str, list[Position]] = defaultdict(list)
    for position in found:
        grouped[position.tenant_id].append(position)
    return dict(grouped)
