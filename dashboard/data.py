"""What each page shows, loaded in one call per page: the pages render, these query.

The benchmark (``benchmarks/dashboard.py``) times these same functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from dashboard.view import View, floor_hour
from gateway import billing
from gateway.db import adjustments, crud, lookups
from gateway.db.figures import (
    attribution,
    budgets,
    endpoints,
    latency,
    prices,
    replicas,
    serving_cost,
    spend,
    tiers,
)
from gateway.db.figures.budgets import BudgetFigures, Refusals
from gateway.db.figures.latency import Ttft
from gateway.db.figures.prices import PaidRate, Unpriced
from gateway.db.figures.replicas import Replica, ReplicaFigures
from gateway.db.figures.serving_cost import ServingCost
from gateway.db.figures.spend import Figures
from gateway.db.gpu_costs import gpu_costs
from gateway.db.session import Session, SessionFactory
from pricing.book import Price


@dataclass(frozen=True, slots=True)
class Overview:
    totals: Figures
    ttft: Ttft
    trend: list[tuple[datetime, Figures]]
    ttft_trend: list[tuple[datetime, Ttft]]
    # UTC days of the period that price corrections adjusted, with the adjustments' sum.
    adjusted: list[tuple[date, Decimal]] = field(default_factory=list)
    # The same figures over the period of as many days just before (``View.previous``).
    previous: Figures = field(default_factory=Figures)
    previous_ttft: Ttft = field(default_factory=Ttft)


def overview(session: Session, view: View) -> Overview:
    """The overview's totals, spend trend, time-to-first-token and price-corrected days for
    the view's scope, and the totals of the period before it."""
    scope, edges, before = view.scope, view.edges(), view.previous().scope
    ttft, ttft_trend = latency.ttft_trend(session, scope, edges)
    return Overview(
        totals=spend.totals(session, scope),
        ttft=ttft,
        trend=spend.trend(session, scope, edges),
        ttft_trend=ttft_trend,
        adjusted=adjustments.adjusted_days(
            session,
            lower=scope.lower,
            upper=scope.upper,
            tenant_ids=scope.tenant_ids,
            models=scope.models,
        ),
        previous=spend.totals(session, before),
        previous_ttft=latency.ttft(session, before),
    )


@dataclass(frozen=True, slots=True)
class Tenants:
    names: dict[str, str]
    figures: dict[str, Figures]


def tenants(session: Session, view: View, only: str | None = None) -> Tenants:
    """Tenant names (``only``: that tenant's), and each tenant's spend in the view's scope."""
    return Tenants(lookups.tenant_names(session, only), spend.by_tenant(session, view.scope))


@dataclass(frozen=True, slots=True)
class Attribution:
    """One tenant's top end users and tags by spend."""

    end_users: list[attribution.Spender]
    tags: list[attribution.Spender]


def attribution_of(session: Session, view: View) -> Attribution:
    """The end users and the tags that spent most in the view's scope."""
    scope = view.scope
    return Attribution(
        attribution.top_end_users(session, scope), attribution.top_tags(session, scope)
    )


def statement(
    sessions: SessionFactory, *, tenant_id: str, start: date, end: date, fmt: str
) -> bytes:
    """A tenant's statement for UTC days start..end: the billing API's bytes."""
    with sessions() as session:
        row = lookups.tenant_row(session, tenant_id)
        if row is None:
            raise LookupError(f"no tenant {tenant_id!r}")
        built = billing.build_statement(session, tenant=row, start=start, end=end)
    return billing.render(built, fmt)[0]


@dataclass(frozen=True, slots=True)
class Budgets:
    """The tenants' budgets in their current periods, and refusals over the view's period."""

    at: datetime
    budgets: list[BudgetFigures]
    refusals: list[tuple[datetime, Refusals]]
    # The price book's currency, budgets' too; None when it has none or several.
    currency: str | None


def budgets_of(
    session: Session, view: View, *, tenant_ids: tuple[str, ...], at: datetime
) -> Budgets:
    """These tenants' (none: all) budgets as of ``at``, and their refusals per bucket."""
    scoped = replace(view, tenant_ids=tenant_ids)
    currencies = {p.currency for p in crud.price_book(session).entries()}
    return Budgets(
        at=at,
        budgets=budgets.budgets(session, at=at, tenant_ids=tenant_ids),
        refusals=budgets.refusals(session, scoped.scope, scoped.edges()),
        currency=currencies.pop() if len(currencies) == 1 else None,
    )


@dataclass(frozen=True, slots=True)
class Models:
    prices: list[Price]
    paid: list[PaidRate]
    unpriced: list[Unpriced]
    endpoints: list[endpoints.EndpointFigures] = field(default_factory=list)


def models(session: Session, view: View) -> Models:
    """The price book's entries, and the rates paid and unpriced requests in the view's scope."""
    return Models(
        prices=crud.price_book(session).entries(),
        paid=prices.paid_rates(session, view.scope),
        unpriced=prices.unpriced(session, view.scope),
        endpoints=endpoints.by_endpoint(session, view.scope),
    )


@dataclass(frozen=True, slots=True)
class Serving:
    names: dict[str, str]
    costs: ServingCost
    # Whether any GPU cost is set at all (none: say how to set one).
    configured: bool


def serving(session: Session, view: View, *, now: datetime | None = None) -> Serving:
    """Cost to serve per vLLM deployment × tenant in the view's period (its hours up to the
    end of the current one), for operators: every tenant's figures, by name."""
    upper = min(view.upper, floor_hour(now or datetime.now(UTC)) + timedelta(hours=1))
    lower = min(view.lower, upper)
    return Serving(
        names=lookups.tenant_names(session),
        costs=serving_cost.serving_cost(session, lower, upper, tenant_ids=view.tenant_ids),
        configured=bool(gpu_costs(session)),
    )


@dataclass(frozen=True, slots=True)
class Routing:
    replicas: list[Replica]
    trend: list[tuple[datetime, ReplicaFigures]]
    tiers: list[tiers.TierFigures] = field(default_factory=list)


def routing(session: Session, view: View) -> Routing:
    """Figures, the routing trend and cache tiers per replica, for the view's scope."""
    return Routing(
        replicas=replicas.by_replica(session, view.scope),
        trend=replicas.routing_trend(session, view.scope, view.edges()),
        tiers=tiers.by_replica(session, view.scope),
    )


def requests(
    session: Session,
    view: View,
    *,
    tenant_id: str | None,
    model: str | None,
    status: str | None,
    limit: int = 100,
) -> list[lookups.RequestLine]:
    """The latest ``limit`` attempts in the view's period, by tenant, model and status if given."""
    return lookups.recent_requests(
        session,
        lower=view.lower,
        upper=view.upper,
        tenant_id=tenant_id,
        model=model,
        status=status,
        limit=limit,
    )
