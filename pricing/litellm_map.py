"""Dated price entries from litellm's model price map (the JSON that ships in its package).

litellm's map is undated and per token, in floats; the book is dated and per million, in
Decimals. An import takes the map as it was on ``captured_on`` and adds an entry only where
the book's entry in force on that day differs (or there is none): entries of earlier dates
are never touched, so a request is still priced with what was in force when it ran.

    input_cost_per_token                 input         cache_read_input_token_cost   cache_read
    cache_creation_input_token_cost      cache_write   ..._above_1hr                 cache_write_1h
    output_cost_per_token                output        *_above_<N>k_tokens           long_context
    *_priority, *_flex, *_batches        tiers priority, flex, batch
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any

from pricing.book import LongContext, Price, PriceBook, Rates, parse_moment

PER_MILLION = Decimal(1_000_000)
TOKEN_MODES = frozenset({"chat", "completion", "responses"})
TIER_SUFFIXES = {"priority": "_priority", "flex": "_flex", "batch": "_batches"}
_THRESHOLD = re.compile(r"^input_cost_per_token_above_(\d+)k_tokens$")


def per_million(value: Any) -> Decimal | None:
    """A per-token float as an exact per-million Decimal (through its shortest repr)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    rate = (Decimal(repr(value)) * PER_MILLION).normalize()
    # normalize() writes 10 as 1E+1; an integer exponent of 0 reads as 10 again.
    return rate.quantize(Decimal(1)) if rate.as_tuple().exponent > 0 else rate  # type: ignore[operator]


def _or(value: Decimal | None, default: Decimal | None) -> Decimal | None:
    return default if value is None else value


def _first(value: Decimal | None, *more: Decimal | None, last: Decimal) -> Decimal:
    """The first rate that is set (a zero rate is set: free cache reads exist)."""
    for candidate in (value, *more):
        if candidate is not None:
            return candidate
    return last


def _rates(entry: Mapping[str, Any], suffix: str = "", base: Rates | None = None) -> Rates | None:
    """The rates named with ``suffix`` (``_priority``, ``_above_200k_tokens``...), if any.

    Without a suffix, input and output are required, and a missing cache-read rate means
    cached tokens are billed as input (no discount known). With one, any rate the suffix
    does not name is the base rate: a tier that lists only input and output keeps the base
    cache rates.
    """

    def rate(name: str) -> Decimal | None:
        return per_million(entry.get(name + suffix))

    input_rate = rate("input_cost_per_token")
    if input_rate is None:
        return None
    read, write = rate("cache_read_input_token_cost"), rate("cache_creation_input_token_cost")
    write_1h = rate("cache_creation_input_token_cost_above_1hr")
    if base is None:
        output = rate("output_cost_per_token")
        if output is None:
            return None
        hit = per_million(entry.get("input_cost_per_token_cache_hit"))  # DeepSeek's older name
        return Rates(
            input=input_rate,
            cache_read=_first(read, hit, last=input_rate),
            output=output,
            cache_write=write,
            cache_write_1h=write_1h,
        )
    return Rates(
        input=input_rate,
        cache_read=_first(read, last=base.cache_read),
        output=_first(rate("output_cost_per_token"), last=base.output),
        cache_write=_or(write, base.cache_write),
        cache_write_1h=_or(write_1h, base.cache_write_1h),
    )


def _long_context(entry: Mapping[str, Any], base: Rates) -> LongContext | None:
    """The lowest threshold the entry lists; the whole request is priced at its rates."""
    thresholds = sorted(int(m.group(1)) for key in entry if (m := _THRESHOLD.match(key)))
    if not thresholds:
        return None
    above = thresholds[0]
    rates = _rates(entry, f"_above_{above}k_tokens", base)
    return None if rates is None else LongContext(above=above * 1000, rates=rates)


def price_from_entry(
    model: str, entry: Mapping[str, Any], *, captured_on: date, source: str
) -> Price | None:
    """One dated entry, or None for a map entry that is not priced per token."""
    if entry.get("mode", "chat") not in TOKEN_MODES:
        return None
    base = _rates(entry)
    if base is None:
        return None
    tiers = []
    for tier, suffix in TIER_SUFFIXES.items():
        rates = _rates(entry, suffix, base)
        if rates is not None:
            tiers.append((tier, rates))
    return Price(
        model=model,
        effective_from=parse_moment(captured_on),
        input=base.input,
        cache_read=base.cache_read,
        cache_write=base.cache_write,
        output=base.output,
        currency="USD",
        source=source,
        captured_on=captured_on,
        cache_write_1h=base.cache_write_1h,
        long_context=_long_context(entry, base),
        tiers=tuple(sorted(tiers)),
    )


def prices_from_map(
    price_map: Mapping[str, Any], *, captured_on: date, source: str, match: str = "*"
) -> list[Price]:
    """Every per-token entry of the map whose name matches the glob ``match``."""
    prices = []
    for model, entry in sorted(price_map.items()):
        if not isinstance(entry, Mapping) or not fnmatch.fnmatchcase(model, match):
            continue
        price = price_from_entry(model, entry, captured_on=captured_on, source=source)
        if price is not None:
            prices.append(price)
    return prices


@dataclass(frozen=True, slots=True)
class ImportPlan:
    """What an import adds; what it leaves alone because the book already says the same."""

    add: list[Price] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def plan_import(book: PriceBook, prices: Iterable[Price]) -> ImportPlan:
    """Add where the entry in force on the capture day differs or is missing.

    An entry already dated exactly then with other rates is a conflict, left as it is.
    """
    plan = ImportPlan()
    for price in prices:
        current = book.price_for(price.model, at=price.effective_from)
        if current is not None and current.charges_like(price):
            plan.unchanged.append(price.id)
        elif current is not None and current.effective_from == price.effective_from:
            plan.conflicts.append(price.id)
        else:
            plan.add.append(price)
    return plan
