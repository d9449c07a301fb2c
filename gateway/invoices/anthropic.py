"""Anthropic's Admin API usage report (``/v1/organizations/usage_report/messages``, grouped
by model) and cost report (``/v1/organizations/cost_report``, grouped by description).

A usage result's classes are disjoint already, as kvgate's are: ``uncached_input_tokens``,
``cache_read_input_tokens``, the cache writes of ``cache_creation`` (5-minute and 1-hour
together) and ``output_tokens``; the usage report counts no requests. A cost result's
``amount`` is a decimal string in the currency's lowest units (cents of USD): "123.45" is
$1.2345. A cost result without a model (``group_by[]=description`` names it) is
unattributed. A bucket counts on the UTC day its ``starting_at`` falls in.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from gateway.invoices import shapes

CENTS = Decimal(100)


def read_anthropic(document: Any) -> shapes.Bill:
    """The bill an Anthropic usage and/or cost report (parsed JSON) adds up to."""
    tally = shapes.tally_pages(document, "Anthropic", _day, _result)
    return tally.bill("anthropic", counts_requests=False)


def _result(tally: shapes.Tally, day: date, result: Mapping[str, Any], where: str) -> None:
    model = shapes.text(result, "model", where)
    if "amount" in result:
        tally.has_costs = True
        currency = shapes.text(result, "currency", where)
        if currency is not None and currency.upper() != "USD":
            raise shapes.InvoiceError(f"{where}.currency is {currency!r}: kvgate reads USD only")
        cents = shapes.decimal(result["amount"], f"{where}.amount")
        tally.add_cost(day, model or shapes.UNATTRIBUTED, cents / CENTS)
        return
    tally.has_usage = True
    if model is None:
        raise shapes.InvoiceError(f"{where} names no model: export usage with group_by[]=model")
    written, at = result.get("cache_creation"), f"{where}.cache_creation"
    writes = shapes.mapping(written, at) if written is not None else {}
    tokens = shapes.Tokens(
        uncached_tokens=shapes.count(result, "uncached_input_tokens", where),
        cache_read_tokens=shapes.count(result, "cache_read_input_tokens", where),
        cache_write_tokens=shapes.count(writes, "ephemeral_5m_input_tokens", at)
        + shapes.count(writes, "ephemeral_1h_input_tokens", at),
        output_tokens=shapes.count(result, "output_tokens", where),
    )
    tally.add_usage(day, model, tokens, 0)


def _day(bucket: Mapping[str, Any], where: str) -> date:
    start = shapes.text(bucket, "starting_at", where)
    try:
        if start is None:
            raise ValueError
        moment = datetime.fromisoformat(start.replace("Z", "+00:00"))
    except ValueError:
        raise shapes.InvoiceError(
            f"{where}.starting_at must be an RFC 3339 moment, not {start!r}"
        ) from None
    moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).date()
