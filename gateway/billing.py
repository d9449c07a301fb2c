"""Billing statements: line items by day × model × price entry × rate set, with exact totals.

The totals are sums of the line items, which are SQL sums of the stored per-request costs,
so a statement's total is exactly the sum of its requests' costs.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, fields
from datetime import date
from decimal import Decimal
from typing import Any

import orjson
from sqlalchemy.orm import Session

from gateway.db import statements
from gateway.db.models import TenantRow
from gateway.errors import InvalidRequest
from pricing.cost import ZERO

MAX_DAYS = 366
TOKEN_FIELDS = (
    "uncached_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "output_tokens",
)
COST_FIELDS = ("cost_uncached", "cost_cache_read", "cost_cache_write", "cost_output", "cost_total")
LINE_FIELDS = tuple(f.name for f in fields(statements.LineItem))


@dataclass(frozen=True, slots=True)
class Totals:
    requests: int
    completed_interactions: int
    uncached_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int
    output_tokens: int
    cost_uncached: Decimal
    cost_cache_read: Decimal
    cost_cache_write: Decimal
    cost_output: Decimal
    cost_total: Decimal
    cost_per_completed_interaction: Decimal | None


@dataclass(frozen=True, slots=True)
class Statement:
    tenant_id: str
    tenant_name: str
    start: date
    end: date
    currency: str
    lines: list[statements.LineItem]
    totals: Totals


def check_period(start: date, end: date) -> None:
    if end == date.max:  # a period ends at the next midnight, and this day has none
        raise InvalidRequest(f"'end' must be before {date.max}", param="end")
    if end < start:
        raise InvalidRequest("'end' must not be before 'start'", param="end")
    if (end - start).days >= MAX_DAYS:
        raise InvalidRequest(f"a statement covers at most {MAX_DAYS} days", param="end")


def build_statement(session: Session, *, tenant: TenantRow, start: date, end: date) -> Statement:
    """A tenant's statement for the UTC days start..end, both included."""
    check_period(start, end)
    lines = statements.statement_lines(session, tenant_id=tenant.id, start=start, end=end)
    lower, upper = statements.day_bounds(start, end)
    completed = statements.period_completed_interactions(
        session, tenant_id=tenant.id, lower=lower, upper=upper
    )
    sums: dict[str, Any] = {
        name: sum((getattr(line, name) for line in lines), ZERO) for name in COST_FIELDS
    }
    total: Decimal = sums["cost_total"]
    currencies = {line.currency for line in lines} or {"USD"}
    return Statement(
        tenant_id=tenant.id,
        tenant_name=tenant.name,
        start=start,
        end=end,
        currency="/".join(sorted(currencies)),
        lines=lines,
        totals=Totals(
            requests=sum(line.requests for line in lines),
            completed_interactions=completed,
            **{name: sum(getattr(line, name) for line in lines) for name in TOKEN_FIELDS},
            **sums,
            cost_per_completed_interaction=(
                (total / completed).quantize(Decimal("0.000000001")) if completed else None
            ),
        ),
    )


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return f"{value:f}"
    if isinstance(value, date):
        return value.isoformat()
    return value


def to_json(statement: Statement) -> bytes:
    """Money as decimal strings, never floats."""
    document = {
        "object": "billing.statement",
        "tenant": {"id": statement.tenant_id, "name": statement.tenant_name},
        "start": statement.start.isoformat(),
        "end": statement.end.isoformat(),
        "currency": statement.currency,
        "line_items": [{k: _plain(v) for k, v in asdict(line).items()} for line in statement.lines],
        "totals": {k: _plain(v) for k, v in asdict(statement.totals).items()},
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2)


def to_csv(statement: Statement) -> bytes:
    """One row per line item and a final TOTAL row."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(LINE_FIELDS)
    for line in statement.lines:
        writer.writerow(["" if v is None else _plain(v) for v in asdict(line).values()])
    totals = asdict(statement.totals)
    writer.writerow(
        ["TOTAL" if name == "day" else _plain(totals.get(name, "")) for name in LINE_FIELDS]
    )
    return buffer.getvalue().encode()


def render(statement: Statement, fmt: str) -> tuple[bytes, str]:
    """The statement's bytes and media type."""
    if fmt == "csv":
        return to_csv(statement), "text/csv; charset=utf-8"
    return to_json(statement), "application/json"
