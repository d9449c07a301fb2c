"""OpenAI's organization Usage API (``/v1/organization/usage/completions``, grouped by
model) and Costs API (``/v1/organization/costs``, grouped by line item) pages.

A usage result's ``input_tokens`` includes its ``input_cached_tokens`` (as chat usage's
``prompt_tokens`` does), so uncached = input - cached; audio tokens are counted apart from
text ones by OpenAI and added to uncached input and output here. OpenAI bills no cache
writes. A cost result's ``line_item`` is ``"<model>, <what>"`` (``"gpt-4o-mini-2024-07-18,
cached input"``): its model is the part before the last comma; a line item without one is
its own name, and a result without a line item is unattributed. A bucket counts on the
UTC day its ``start_time`` falls in.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from gateway.invoices import shapes

USAGE = "organization.usage."  # completions, and the other usage kinds read the same way
COSTS = "organization.costs.result"


def read_openai(document: Any) -> shapes.Bill:
    """The bill an OpenAI usage and/or costs export (parsed JSON) adds up to."""
    tally = shapes.tally_pages(document, "OpenAI", _day, _result)
    return tally.bill("openai", counts_requests=True)


def _result(tally: shapes.Tally, day: date, result: Mapping[str, Any], where: str) -> None:
    kind = shapes.text(result, "object", where)
    if kind == COSTS or (kind is None and "amount" in result):
        tally.has_costs = True
        tally.add_cost(day, _line_model(result, where), _usd(result, where))
    elif kind is None or kind.startswith(USAGE):
        tally.has_usage = True
        model = shapes.text(result, "model", where)
        if model is None:
            raise shapes.InvoiceError(f"{where} names no model: export usage with group_by=model")
        total, cached = (
            shapes.count(result, "input_tokens", where),
            shapes.count(result, "input_cached_tokens", where),
        )
        if cached > total:
            raise shapes.InvoiceError(
                f"{where}: input_cached_tokens ({cached}) is part of input_tokens ({total}), "
                "not more"
            )
        tokens = shapes.Tokens(
            uncached_tokens=total - cached + shapes.count(result, "input_audio_tokens", where),
            cache_read_tokens=cached,
            output_tokens=shapes.count(result, "output_tokens", where)
            + shapes.count(result, "output_audio_tokens", where),
        )
        tally.add_usage(day, model, tokens, shapes.count(result, "num_model_requests", where))
    else:
        raise shapes.InvoiceError(f"{where}.object is {kind!r}: neither a usage nor a costs result")


def _day(bucket: Mapping[str, Any], where: str) -> date:
    start = bucket.get("start_time")
    if isinstance(start, bool) or not isinstance(start, int):
        raise shapes.InvoiceError(
            f"{where}.start_time must be a Unix time in seconds, not {start!r}"
        )
    return datetime.fromtimestamp(start, UTC).date()


def _line_model(result: Mapping[str, Any], where: str) -> str:
    line = shapes.text(result, "line_item", where)
    if not line:
        return shapes.UNATTRIBUTED
    return line.rsplit(", ", 1)[0] if ", " in line else line


def _usd(result: Mapping[str, Any], where: str) -> Decimal:
    amount = shapes.mapping(result.get("amount"), f"{where}.amount")
    currency = shapes.text(amount, "currency", f"{where}.amount")
    if currency is not None and currency.lower() != "usd":
        raise shapes.InvoiceError(f"{where}.amount.currency is {currency!r}: kvgate reads USD only")
    return shapes.decimal(amount.get("value", 0), f"{where}.amount.value")
