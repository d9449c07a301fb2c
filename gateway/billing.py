"""Billing statements: line items by day × model × price entry × rate set × usage source,
with exact totals.

The totals are sums of the line items, which are SQL sums of the stored per-request costs,
so a statement's total is exactly the sum of its requests' costs. A line's rates are those
its costs were computed with: each request's cost per class is its tokens × the rate,
rounded half-even to the nano-unit, so a line's cost is its tokens × its rates exactly
whenever that product needs no more than nine decimal places per request (rates of up to
three decimal places per million tokens), and otherwise within half a nano-unit per request.

A line without a price entry says so (``priced: false``): no rates, no currency and no
money (null in JSON, empty in CSV), never a cost of 0 in an assumed currency. The billing
API, the admin API, the CLI and the dashboard all serve ``render``'s bytes.

Price corrections (db/adjustments.py) never change a line: their adjustments of the
statement's days follow the lines as lines of their own, and the totals before and after
them follow the totals.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import orjson

from gateway.db import adjustments, statements, sums
from gateway.db.models import TAG_KEY, TenantRow
from gateway.db.session import Session
from gateway.db.sums import Sums
from gateway.errors import InvalidRequest
from gateway.usage import UsageSource
from pricing.cost import NANO, ZERO

MAX_DAYS = 366
RATES = ("input_rate", "cache_read_rate", "cache_write_rate", "cache_write_1h_rate", "output_rate")
CHARGES = tuple(name for name in sums.COSTS if name != "cost_uncached_equivalent")
# The statement's columns: names are a contract, and columns added later go at the end, so
# a CSV reader that goes by position keeps reading what it read before.
LATER_LINE_COLUMNS = ("group", "endpoint")  # by end user or tag; the endpoint's path
LINE_COLUMNS = (
    "day",
    "model",
    "price_id",
    "rate_class",
    "currency",
    "requests",
    "completed_interactions",
    *sums.TOKENS,
    *RATES,
    *CHARGES,
    "usage_source",
    "priced",
    "cost_uncached_equivalent",
    *LATER_LINE_COLUMNS,
)
TOTAL_COLUMNS = (
    "requests",
    "completed_interactions",
    *sums.TOKENS,
    *CHARGES,
    "cost_per_completed_interaction",
    "cost_uncached_equivalent",
    "priced_completed_interactions",
    "unpriced_completed_interactions",
    "unpriced_interaction_share",
    "unpriced_requests",
    "unpriced_tokens",
    "estimated_requests",
    "estimated_tokens",
    "missing_requests",
)
# A price correction's adjustment of one day × model (db/adjustments.py): its own line,
# after the line items; the records' lines and ``totals`` stay what they were recorded as.
ADJUSTMENT_COLUMNS = (
    "day",
    "model",
    "price_id",
    "currency",
    "requests",
    "billed",
    "corrected",
    "delta",
    "corrected_rates",
    "reason",
    "by",
    "created_at",
    "id",
    "correction_key",
)
ADJUSTED_TOTAL_COLUMNS = (
    "cost_total_before_adjustments",
    "adjustment_total",
    "cost_total_after_adjustments",
)
# Line columns added after the totals-only ones (the CSV's first columns keep their places),
# then an adjustment's own columns (its day, model, price_id, currency and requests go in
# the lines' columns), then the TOTAL row's totals before and after the adjustments.
ADJUSTMENT_CSV_COLUMNS = {
    "id": "adjustment_id",
    "billed": "adjustment_billed",
    "corrected": "adjustment_corrected",
    "delta": "adjustment_delta",
    "corrected_rates": "adjustment_rates",
    "reason": "adjustment_reason",
    "by": "adjustment_by",
    "created_at": "adjusted_at",
    "correction_key": "correction_key",
}
CSV_COLUMNS = (
    *(name for name in LINE_COLUMNS if name not in LATER_LINE_COLUMNS),
    *(name for name in TOTAL_COLUMNS if name not in LINE_COLUMNS),
    *LATER_LINE_COLUMNS,
    *ADJUSTMENT_CSV_COLUMNS.values(),
    *ADJUSTED_TOTAL_COLUMNS,
)


@dataclass(frozen=True, slots=True)
class Totals:
    """The statement's sums: every line, and the unpriced, estimated and missing ones.

    Money sums priced lines only (an unpriced line's stored costs are 0). Cost per
    completed interaction is the cost of priced attempts (failed and retried ones
    included) over the completed interactions that a priced attempt completed; the
    completed interactions no priced attempt completed are counted beside it, and are
    ``unpriced_interaction_share`` of all completed interactions.
    """

    sums: Sums
    unpriced: Sums
    estimated: Sums
    missing: Sums
    completed: statements.Completed

    @property
    def cost_per_completed_interaction(self) -> Decimal | None:
        """Cost of priced attempts / priced completed interactions, to the nano-unit."""
        if not self.completed.priced:
            return None
        return (self.sums.cost_total / self.completed.priced).quantize(NANO)

    @property
    def unpriced_interaction_share(self) -> Decimal | None:
        """Completed interactions no priced attempt completed / all completed ones."""
        if not self.completed.interactions:
            return None
        return (Decimal(self.completed.unpriced) / self.completed.interactions).quantize(NANO)

    def fields(self) -> dict[str, Any]:
        """The totals by column name, in ``TOTAL_COLUMNS`` order."""
        values: dict[str, Any] = {
            **self.sums.as_dict(),
            "completed_interactions": self.completed.interactions,
            "cost_per_completed_interaction": self.cost_per_completed_interaction,
            "priced_completed_interactions": self.completed.priced,
            "unpriced_completed_interactions": self.completed.unpriced,
            "unpriced_interaction_share": self.unpriced_interaction_share,
            "unpriced_requests": self.unpriced.requests,
            "unpriced_tokens": self.unpriced.tokens,
            "estimated_requests": self.estimated.requests,
            "estimated_tokens": self.estimated.tokens,
            "missing_requests": self.missing.requests,
        }
        return {name: values[name] for name in TOTAL_COLUMNS}


@dataclass(frozen=True, slots=True)
class Statement:
    tenant_id: str
    tenant_name: str
    start: date
    end: date
    currency: str | None  # of the priced lines; None when no line is priced
    lines: list[statements.LineItem]
    totals: Totals
    group_by: str | None = None  # end_user or tag:KEY: lines split by that value
    # Price corrections of the period's days, in the order they apply (never in the lines).
    adjustments: tuple[adjustments.Adjustment, ...] = ()

    @property
    def adjustment_total(self) -> Decimal:
        """The adjustments' deltas summed: what the corrections add (negative: give back)."""
        return sum((adjustment.delta for adjustment in self.adjustments), ZERO)

    def adjusted_fields(self) -> dict[str, Decimal]:
        """The cost total before the adjustments, their sum, and the total after them."""
        before = self.totals.sums.cost_total
        total = self.adjustment_total
        values = (before, total, before + total)
        return dict(zip(ADJUSTED_TOTAL_COLUMNS, values, strict=True))


def adjustment_fields(adjustment: adjustments.Adjustment) -> dict[str, Any]:
    """An adjustment by column name, in ``ADJUSTMENT_COLUMNS`` order."""
    values: dict[str, Any] = {
        "day": adjustment.day,
        "model": adjustment.model,
        "price_id": adjustment.price_id,
        "currency": adjustment.currency,
        "requests": adjustment.requests,
        "billed": adjustment.billed,
        "corrected": adjustment.corrected,
        "delta": adjustment.delta,
        "corrected_rates": adjustment.corrected_rates,
        "reason": adjustment.reason,
        "by": adjustment.by,
        "created_at": adjustment.created_at,
        "id": adjustment.id,
        "correction_key": adjustment.correction_key,
    }
    return {name: values[name] for name in ADJUSTMENT_COLUMNS}


def line_fields(line: statements.LineItem) -> dict[str, Any]:
    """A line by column name, in ``LINE_COLUMNS`` order: no rates or money when unpriced."""
    rates = line.rates
    applied = (
        (rates.input, rates.cache_read, rates.cache_write, rates.cache_write_1h, rates.output)
        if rates is not None
        else (None,) * len(RATES)
    )
    money = line.sums.as_dict()
    values: dict[str, Any] = {
        "day": line.day,
        "model": line.model,
        "endpoint": line.endpoint,
        "price_id": line.price_id,
        "rate_class": line.rate_class,
        "currency": line.currency,
        "completed_interactions": line.completed_interactions,
        **money,
        **{name: money[name] if line.priced else None for name in sums.COSTS},
        **dict(zip(RATES, applied, strict=True)),
        "usage_source": line.usage_source,
        "priced": line.priced,
        "group": line.group,
    }
    return {name: values[name] for name in LINE_COLUMNS}


def parse_group_by(group_by: str | None) -> statements.Grouping | None:
    """``end_user`` or ``tag:KEY`` (gateway/api/attribution.py), else a 400."""
    if group_by is None or group_by == "":
        return None
    if group_by == "end_user":
        return statements.Grouping()
    kind, colon, key = group_by.partition(":")
    if kind == "tag" and colon and TAG_KEY.fullmatch(key) and key.isprintable():
        return statements.Grouping(tag=key)
    raise InvalidRequest("'group_by' must be 'end_user' or 'tag:KEY'", param="group_by")


def check_period(start: date, end: date) -> None:
    """InvalidRequest unless ``start``..``end`` is a period a statement can cover."""
    if end == date.max:  # a period ends at the next midnight, and this day has none
        raise InvalidRequest(f"'end' must be before {date.max}", param="end")
    if end < start:
        raise InvalidRequest("'end' must not be before 'start'", param="end")
    if (end - start).days >= MAX_DAYS:
        raise InvalidRequest(f"a statement covers at most {MAX_DAYS} days", param="end")


def build_statement(
    session: Session,
    *,
    tenant: TenantRow,
    start: date,
    end: date,
    group_by: str | None = None,
) -> Statement:
    """A tenant's statement for the UTC days start..end, both included; its lines split by
    end user or by a tag's value with ``group_by`` (``end_user``, ``tag:KEY``)."""
    check_period(start, end)
    grouping = parse_group_by(group_by)
    if grouping is None:  # the writer's lines (gateway/db/writer/lines.py)
        lines = statements.rolled_lines(session, tenant_id=tenant.id, start=start, end=end)
    else:  # split by end user or tag: from the requests
        lines = statements.statement_lines(
            session, tenant_id=tenant.id, start=start, end=end, grouping=grouping
        )
    lower, upper = statements.day_bounds(start, end)
    completed = statements.rolled_completed(session, tenant_id=tenant.id, lower=lower, upper=upper)

    def total(wanted: Callable[[statements.LineItem], bool]) -> Sums:
        return sum((line.sums for line in lines if wanted(line)), Sums())

    corrections = adjustments.for_tenant(session, tenant_id=tenant.id, start=start, end=end)
    currencies = {line.currency for line in lines if line.currency is not None}
    currencies |= {a.currency for a in corrections if a.currency is not None}
    return Statement(
        tenant_id=tenant.id,
        tenant_name=tenant.name,
        start=start,
        end=end,
        currency="/".join(sorted(currencies)) or None,
        lines=lines,
        totals=Totals(
            sums=total(lambda _: True),
            unpriced=total(lambda line: not line.priced),
            estimated=total(lambda line: line.usage_source == UsageSource.ESTIMATED),
            missing=total(lambda line: line.usage_source == UsageSource.MISSING),
            completed=completed,
        ),
        group_by=grouping.name if grouping is not None else None,
        adjustments=tuple(corrections),
    )


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return f"{value:f}"
    if isinstance(value, datetime):
        return f"{value.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    if isinstance(value, date):
        return value.isoformat()
    return value


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):  # an adjustment's rates: input=3;cache_read=0.3;...
        return ";".join(f"{name}={rate}" for name, rate in value.items())
    return _plain(value)


def to_json(statement: Statement) -> bytes:
    """Money as decimal strings, never floats; what is unknown is null."""
    document = {
        "object": "billing.statement",
        "tenant": {"id": statement.tenant_id, "name": statement.tenant_name},
        "start": statement.start.isoformat(),
        "end": statement.end.isoformat(),
        "currency": statement.currency,
        "group_by": statement.group_by,
        "line_items": [
            {k: _plain(v) for k, v in line_fields(line).items()} for line in statement.lines
        ],
        "adjustments": [
            {k: _plain(v) for k, v in adjustment_fields(adjustment).items()}
            for adjustment in statement.adjustments
        ],
        "totals": {k: _plain(v) for k, v in statement.totals.fields().items()},
        "adjusted_totals": {k: _plain(v) for k, v in statement.adjusted_fields().items()},
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2)


def to_csv(statement: Statement) -> bytes:
    """One row per line item, one per adjustment, and a final TOTAL row; what is unknown
    is an empty cell.

    Line rows leave the totals-only columns empty; adjustment rows fill their day, model,
    price_id, currency and requests and their own ``adjustment_*`` columns; the TOTAL row
    leaves the line-only ones empty, carries the statement's currency, and its totals
    before and after the adjustments.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for line in statement.lines:
        values = line_fields(line)
        writer.writerow([_cell(values.get(name)) for name in CSV_COLUMNS])
    for adjustment in statement.adjustments:
        values = {
            ADJUSTMENT_CSV_COLUMNS.get(name, name): value
            for name, value in adjustment_fields(adjustment).items()
        }
        writer.writerow([_cell(values.get(name)) for name in CSV_COLUMNS])
    totals = {
        **statement.totals.fields(),
        **statement.adjusted_fields(),
        "day": "TOTAL",
        "currency": statement.currency,
    }
    writer.writerow([_cell(totals.get(name)) for name in CSV_COLUMNS])
    return buffer.getvalue().encode()


def render(statement: Statement, fmt: str) -> tuple[bytes, str]:
    """The statement's bytes and media type."""
    if fmt == "csv":
        return to_csv(statement), "text/csv; charset=utf-8"
    return to_json(statement), "application/json"
