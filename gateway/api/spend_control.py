"""Budgets and rate limits: /v1/admin/budgets and /v1/admin/limits (admin token), and a
tenant's own budgets with what they spent and what remains, /v1/billing/budgets."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.api.admin import SECURED, publish
from gateway.api.deps import AdminDep, SessionDep, TenantDep
from gateway.api.openapi import TENANT_KEY, errors
from gateway.budgets import (
    DEFAULT_ALERTS,
    LIMITABLE,
    Budget,
    Period,
    RateLimit,
    ScopeKind,
    parse_alerts,
    parse_limit,
    parse_scope,
    reset_text,
)
from gateway.db import spend
from gateway.db.session import Session

admin_router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=errors(400, 401, 404))
billing_router = APIRouter(prefix="/v1/billing", tags=["billing"], responses=errors(400, 401))


class NewBudget(BaseModel):
    """A budget to set: the same scope and period again changes it."""

    model_config = ConfigDict(extra="forbid")
    scope: str = Field(
        max_length=300,
        description=(
            "tenant:NAME, key:KEY_ID, user:TENANT/USER, tag:TENANT/KEY=VALUE or interaction:TENANT."
        ),
    )
    limit: Decimal = Field(description="The most the scope may spend per period.")
    period: Period
    timezone: str = Field(default="UTC", max_length=64)
    alert_at: list[Decimal] = Field(default_factory=lambda: list(DEFAULT_ALERTS), max_length=20)
    webhook: str | None = Field(default=None, max_length=2000)


class _ScopedOut(BaseModel):
    # A budget or rate limit as the API shows it, read from the value's own attributes
    # (``model_validate(value)``), its scope as text.
    model_config = ConfigDict(from_attributes=True)

    id: str
    scope: str

    @field_validator("scope", mode="before")
    @classmethod
    def _scope_text(cls, scope: Any) -> str:
        return str(scope)


class BudgetOut(_ScopedOut):
    """A budget; ``spent``/``reserved``/``remaining`` are its current period's (an
    interaction budget's are each interaction's own, so none are shown). ``reserved`` is
    what requests in flight and the workers' leases hold; ``remaining`` is the limit less
    what was spent."""

    limit: Decimal
    period: Period
    timezone: str
    alert_at: list[Decimal]
    webhook: str | None
    period_start: datetime | None = None
    resets: str | None = None
    spent: Decimal | None = None
    reserved: Decimal | None = None
    remaining: Decimal | None = None


class BudgetList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BudgetOut]


def budget_out(session: Session, budget: Budget, at: datetime) -> BudgetOut:
    """The budget as the API shows it at ``at``: its period, and spend unless per interaction."""
    out = _settings_out(budget)
    start, end = budget.bounds(at)
    out.period_start, out.resets = start, reset_text(end)
    if budget.scope.kind is not ScopeKind.INTERACTION:
        out.spent, out.reserved = spend.counter(session, budget.id, start)
        out.remaining = max(budget.limit - out.spent, Decimal(0))
    return out


def _settings_out(budget: Budget) -> BudgetOut:
    """A budget as it is set, without its period's spend."""
    return BudgetOut.model_validate(budget)


@admin_router.post("/budgets", status_code=201, openapi_extra=SECURED)
def set_budget(_: AdminDep, request: Request, body: NewBudget) -> BudgetOut:
    """Set a budget; enforced on every gateway once this returns."""
    scope = parse_scope(body.scope)
    limit = parse_limit(body.limit)
    alerts = parse_alerts(tuple(body.alert_at))
    budget = publish(
        request,
        lambda session: spend.set_budget(
            session,
            scope=scope,
            limit=limit,
            period=body.period,
            timezone=body.timezone,
            alert_at=alerts,
            webhook=body.webhook,
        ),
    )
    with request.app.state.sessions() as session:
        return budget_out(session, budget, datetime.now(UTC))


@admin_router.get("/budgets", openapi_extra=SECURED)
def list_budgets(_: AdminDep, session: SessionDep) -> BudgetList:
    """Every budget, with its current period's spend."""
    at = datetime.now(UTC)
    return BudgetList(data=[budget_out(session, b, at) for b in spend.list_budgets(session)])


@admin_router.delete("/budgets/{budget_id}", openapi_extra=SECURED)
def delete_budget(_: AdminDep, request: Request, budget_id: str) -> BudgetOut:
    """Remove a budget; no gateway enforces it once this returns."""
    budget = publish(request, lambda session: spend.delete_budget(session, budget_id=budget_id))
    return _settings_out(budget)


@billing_router.get("/budgets", openapi_extra={"security": [{TENANT_KEY: []}]})
def my_budgets(tenant: TenantDep, session: SessionDep) -> BudgetList:
    """The calling tenant's budgets (its keys' too): spend, reserved and what remains."""
    at = datetime.now(UTC)
    found = spend.list_budgets(session, tenant_id=tenant.tenant_id)
    return BudgetList(data=[budget_out(session, b, at) for b in found])


class NewLimit(BaseModel):
    """A rate limit to set on a tenant or key (the same scope again changes it)."""

    model_config = ConfigDict(extra="forbid")
    scope: str = Field(max_length=300, description="tenant:NAME or key:KEY_ID.")
    requests_per_minute: int | None = Field(default=None, ge=0, le=10**9)
    tokens_per_minute: int | None = Field(default=None, ge=0, le=10**15)


class LimitOut(_ScopedOut):
    requests_per_minute: int | None
    tokens_per_minute: int | None


class LimitList(BaseModel):
    object: Literal["list"] = "list"
    data: list[LimitOut]


def limit_out(limit: RateLimit) -> LimitOut:
    """The rate limit as the API shows it."""
    return LimitOut.model_validate(limit)


@admin_router.post("/limits", status_code=201, openapi_extra=SECURED)
def set_limit(_: AdminDep, request: Request, body: NewLimit) -> LimitOut:
    """Set a rate limit; enforced on every gateway once this returns."""
    scope = parse_scope(body.scope, allowed=LIMITABLE)
    limit = publish(
        request,
        lambda session: spend.set_limit(
            session,
            scope=scope,
            requests_per_minute=body.requests_per_minute,
            tokens_per_minute=body.tokens_per_minute,
        ),
    )
    return limit_out(limit)


@admin_router.get("/limits", openapi_extra=SECURED)
def list_limits(_: AdminDep, session: SessionDep) -> LimitList:
    """Every rate limit."""
    return LimitList(data=[limit_out(r) for r in spend.list_limits(session)])


@admin_router.delete("/limits/{limit_id}", openapi_extra=SECURED)
def delete_limit(_: AdminDep, request: Request, limit_id: str) -> LimitOut:
    """Remove a rate limit; no gateway enforces it once this returns."""
    limit = publish(request, lambda session: spend.delete_limit(session, limit_id=limit_id))
    return limit_out(limit)
