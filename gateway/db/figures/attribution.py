"""Cost attribution: a tenant's spend by end user and by tag, from its requests.

Read from the requests themselves (end users and tags are not rolled up): one grouped
query per kind over the scope's rows, served by the (tenant_id, started_at) index. A
request with several tags counts in full under each of them, so the tags' spends add up
to more than the tenant's when requests carry several.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson
from sqlalchemy import Text, cast, func, select
from sqlalchemy.orm import Session

from gateway.db.figures.spend import Scope
from gateway.db.models import RequestRow


@dataclass(frozen=True, slots=True)
class Spender:
    """One end user, or one tag as ``key=value``, with what its requests cost."""

    name: str
    requests: int
    cost_total: Decimal


def in_scope(scope: Scope) -> list[Any]:
    """The conditions on requests rows of the scope: its period, tenants and models."""
    conditions = [RequestRow.started_at >= scope.lower, RequestRow.started_at < scope.upper]
    if scope.tenant_ids:
        conditions.append(RequestRow.tenant_id.in_(scope.tenant_ids))
    if scope.models:
        conditions.append(RequestRow.model.in_(scope.models))
    return conditions


def _top(spenders: list[Spender], limit: int) -> list[Spender]:
    return sorted(spenders, key=lambda s: (-s.cost_total, -s.requests, s.name))[:limit]


def top_end_users(session: Session, scope: Scope, *, limit: int = 10) -> list[Spender]:
    """The end users that spent most in the scope (requests that named one)."""
    query = (
        select(
            RequestRow.end_user,
            func.count().label("requests"),
            func.sum(RequestRow.cost_total).label("cost_total"),
        )
        .where(*in_scope(scope), RequestRow.end_user.is_not(None))
        .group_by(RequestRow.end_user)
    )
    found = [Spender(str(r[0]), int(r[1]), Decimal(r[2])) for r in session.execute(query)]
    return _top(found, limit)


def top_tags(session: Session, scope: Scope, *, limit: int = 10) -> list[Spender]:
    """The tags (``key=value``) whose requests spent most in the scope.

    Grouped in SQL by the tags' JSON text (Postgres cannot group ``json`` itself), then
    split into single tags here.
    """
    text = cast(RequestRow.tags, Text)
    query = (
        select(
            text.label("tags"),
            func.count().label("requests"),
            func.sum(RequestRow.cost_total).label("cost_total"),
        )
        .where(*in_scope(scope), RequestRow.tags.is_not(None))
        .group_by(text)
    )
    requests: dict[str, int] = defaultdict(int)
    costs: dict[str, Decimal] = defaultdict(Decimal)
    for tags, count, cost in session.execute(query):
        parsed = orjson.loads(tags) if tags else None
        if not isinstance(parsed, dict):
            continue  # JSON null
        for key, value in parsed.items():
            name = f"{key}={value}"
            requests[name] += int(count)
            costs[name] += Decimal(cost)
    return _top([Spender(n, requests[n], costs[n]) for n in requests], limit)
