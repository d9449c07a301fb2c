"""What the test's requests cost: from their usage and a price per million tokens.

The price comes from the command line, or, against kvgate, from the caller's own billing
statement (the rates of the line items for the model tested). Money is Decimal, rounded to
the nano-dollar per token class per request, as kvgate bills (``pricing.cost.money``).
Input cost = uncached × input rate + cached × cache-read rate; without the cache every
prompt token would have paid the input rate (the uncached equivalent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gateway.tools.cachetest.client import Outcome
from pricing.book import Rates
from pricing.cost import ZERO, money


@dataclass(frozen=True, slots=True)
class Spend:
    """Tokens and money of a set of requests."""

    requests: int
    completed: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    input_cost: Decimal | None
    uncached_input_cost: Decimal | None  # the same prompts with nothing cached
    output_cost: Decimal | None

    @property
    def token_hit_rate(self) -> float:
        """Cached tokens over prompt tokens; 0.0 without prompt tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def cost_per_completed(self) -> Decimal | None:
        """All cost (failed requests too) over completed interactions (one request each)."""
        if self.input_cost is None or self.output_cost is None or not self.completed:
            return None
        return _per(self.input_cost + self.output_cost, self.completed)

    @property
    def uncached_cost_per_completed(self) -> Decimal | None:
        """The same, had no prompt token been cached."""
        if self.uncached_input_cost is None or self.output_cost is None or not self.completed:
            return None
        return _per(self.uncached_input_cost + self.output_cost, self.completed)


def input_cost(outcome: Outcome, price: Rates) -> Decimal:
    """One request's input cost."""
    uncached = outcome.prompt_tokens - outcome.cached_tokens
    return money(uncached, price.input) + money(outcome.cached_tokens, price.cache_read)


def spend(outcomes: Iterable[Outcome], price: Rates | None) -> Spend:
    """Sum the requests' tokens, and their cost when there is a price."""
    listed = list(outcomes)
    cost = uncached = output = None
    if price is not None:
        cost = sum((input_cost(o, price) for o in listed), ZERO)
        uncached = sum((money(o.prompt_tokens, price.input) for o in listed), ZERO)
        output = sum((money(o.output_tokens, price.output) for o in listed), ZERO)
    return Spend(
        requests=len(listed),
        completed=sum(o.ok for o in listed),
        prompt_tokens=sum(o.prompt_tokens for o in listed),
        cached_tokens=sum(o.cached_tokens for o in listed),
        output_tokens=sum(o.output_tokens for o in listed),
        input_cost=cost,
        uncached_input_cost=uncached,
        output_cost=output,
    )


def statement_price(document: Mapping[str, Any], model: str) -> Rates | None:
    """The rates kvgate billed ``model`` at, from a statement's line items (the latest)."""
    lines: Sequence[Mapping[str, Any]] = document.get("line_items") or []
    for line in reversed(lines):
        if line.get("model") != model or line.get("input_rate") is None:
            continue
        # Stored as Numeric(18, 9): "0.150000000" is the rate 0.15.
        return Rates(
            input=Decimal(line["input_rate"]).normalize(),
            cache_read=Decimal(line.get("cache_read_rate") or line["input_rate"]).normalize(),
            output=Decimal(line.get("output_rate") or "0").normalize(),
        )
    return None


def change(before: Decimal | float | None, after: Decimal | float | None) -> float | None:
    """(after - before) / before, or None when it has no meaning."""
    if before is None or after is None or not before:
        return None
    return float((Decimal(str(after)) - Decimal(str(before))) / Decimal(str(before)))


def _per(total: Decimal, count: int) -> Decimal:
    return (total / count).quantize(Decimal("0.000000001"))
