"""What a provider's export is read into, and the checked reads every format shares.

A member that is missing or null counts as zero; one of the wrong type is an
``InvoiceError`` that names where it is (``usage.data[0].results[1].output_tokens``) and
what it holds. Members kvgate does not read are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Any

from pricing.tokens import TokenClasses

ZERO = Decimal(0)
UNATTRIBUTED = "(unattributed)"  # a cost the provider names no model for


class InvoiceError(ValueError):
    """A provider export that cannot be read; the message says where and what is wrong."""


@dataclass(frozen=True, slots=True)
class Tokens(TokenClasses):
    """Tokens in kvgate's four disjoint classes, as a bill or kvgate's records count them."""

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            self.uncached_tokens + other.uncached_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.output_tokens + other.output_tokens,
        )

    def as_dict(self) -> dict[str, int]:
        """Class name (``uncached``, ``cache_read``, ``cache_write``, ``output``) → tokens."""
        return {
            "uncached": self.uncached_tokens,
            "cache_read": self.cache_read_tokens,
            "cache_write": self.cache_write_tokens,
            "output": self.output_tokens,
        }


@dataclass(frozen=True, slots=True)
class Billed:
    """What a provider counted and charged for one model id on one UTC day."""

    day: date
    model: str  # the provider's own id (a dated snapshot, as it bills it)
    tokens: Tokens = Tokens()
    requests: int = 0
    cost: Decimal = ZERO  # USD, exact


@dataclass(frozen=True, slots=True)
class Bill:
    """A provider's export: its lines, which reports it held, the days its buckets cover."""

    provider: str
    lines: tuple[Billed, ...]
    has_usage: bool  # the file held a usage report (else: no provider tokens to compare)
    has_costs: bool  # the file held a cost report (else: no provider cost to compare)
    counts_requests: bool  # the usage report counts requests (OpenAI's does)
    first_day: date | None = None
    last_day: date | None = None
    warnings: tuple[str, ...] = ()


@dataclass
class Tally:
    """A bill being read: sums per (day, model id), and what the file held."""

    usage: dict[tuple[date, str], tuple[Tokens, int]] = field(default_factory=dict)
    costs: dict[tuple[date, str], Decimal] = field(default_factory=dict)
    days: set[date] = field(default_factory=set)
    has_usage: bool = False
    has_costs: bool = False
    warnings: list[str] = field(default_factory=list)

    def add_usage(self, day: date, model: str, tokens: Tokens, requests: int) -> None:
        """Count tokens and requests for a model id on a day."""
        before, counted = self.usage.get((day, model), (Tokens(), 0))
        self.usage[(day, model)] = (before + tokens, counted + requests)

    def add_cost(self, day: date, model: str, amount: Decimal) -> None:
        """Count USD for a model id on a day."""
        self.costs[(day, model)] = self.costs.get((day, model), ZERO) + amount

    def bill(self, provider: str, *, counts_requests: bool) -> Bill:
        """The bill read: one line per (day, model id) either report named."""
        lines = []
        for key in sorted(self.usage.keys() | self.costs.keys()):
            tokens, requests = self.usage.get(key, (Tokens(), 0))
            lines.append(Billed(key[0], key[1], tokens, requests, self.costs.get(key, ZERO)))
        return Bill(
            provider,
            tuple(lines),
            self.has_usage,
            self.has_costs,
            counts_requests,
            min(self.days, default=None),
            max(self.days, default=None),
            tuple(self.warnings),
        )


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` as a JSON object, else an error naming ``where``."""
    if not isinstance(value, Mapping):
        raise InvoiceError(f"{where} must be a JSON object, not {_kind(value)}")
    return value


def items(value: Any, where: str) -> list[Any]:
    """``value`` as a JSON array (missing or null: empty), else an error naming ``where``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvoiceError(f"{where} must be a JSON array, not {_kind(value)}")
    return value


def count(obj: Mapping[str, Any], name: str, where: str) -> int:
    """A non-negative whole number member (missing or null: 0)."""
    value = obj.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvoiceError(f"{where}.{name} must be a non-negative whole number, not {value!r}")
    return value


def text(obj: Mapping[str, Any], name: str, where: str) -> str | None:
    """A string member (missing or null: None)."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvoiceError(f"{where}.{name} must be a string, not {value!r}")
    return value


def decimal(value: Any, where: str) -> Decimal:
    """A JSON number (read exactly) or a decimal string, as a Decimal."""
    if isinstance(value, bool) or not isinstance(value, int | Decimal | str):
        raise InvoiceError(f"{where} must be a number or a decimal string, not {value!r}")
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise InvoiceError(f"{where} must be a number or a decimal string, not {value!r}") from None
    if not amount.is_finite():
        raise InvoiceError(f"{where} must be a finite amount, not {value!r}")
    return amount


def pages(document: Any, provider: str) -> list[tuple[str, str | None, Mapping[str, Any]]]:
    """The pages a file holds, as (where, declared kind or None, page): one page,
    ``{"usage": page or [pages], "costs": page or [pages]}``, or a list of pages."""
    shapes = (
        f'an {provider} export is a page ({{"data": [...]}}), {{"usage": page, "costs": page}} '
        "or a list of pages"
    )
    if isinstance(document, list):
        return [(f"[{i}]", None, mapping(page, f"[{i}]")) for i, page in enumerate(document)]
    if not isinstance(document, Mapping):
        raise InvoiceError(f"{shapes}; this file holds {_kind(document)}")
    if "data" in document:
        return [("page", None, document)]
    if not {"usage", "costs"} & document.keys():
        raise InvoiceError(f"{shapes}; this object has none of data, usage, costs")
    found: list[tuple[str, str | None, Mapping[str, Any]]] = []
    for kind in ("usage", "costs"):
        held = document.get(kind)
        if held is None:
            continue
        if isinstance(held, list):
            found += [
                (f"{kind}[{i}]", kind, mapping(p, f"{kind}[{i}]")) for i, p in enumerate(held)
            ]
        else:
            found.append((kind, kind, mapping(held, kind)))
    return found


def more_pages(found: list[tuple[str, str | None, Mapping[str, Any]]]) -> list[str]:
    """A warning for each report whose last page says more pages follow."""
    last: dict[str | None, tuple[str, Mapping[str, Any]]] = {}
    for where, kind, page in found:
        last[kind] = (where, page)
    return [
        f"{where} says has_more: the export may be incomplete (fetch next_page "
        f"{page.get('next_page')!r} too)"
        for where, page in last.values()
        if page.get("has_more") is True
    ]


# A provider's reading of one result of a bucket: (tally, the bucket's UTC day, the result,
# where it stands in the file, for errors).
ResultReader = Callable[["Tally", date, Mapping[str, Any], str], None]


def tally_pages(
    document: Any,
    provider: str,
    day_of: Callable[[Mapping[str, Any], str], date],
    read: ResultReader,
) -> Tally:
    """Every page's buckets (``data``), each of their ``results`` read on the bucket's day."""
    tally = Tally()
    found = pages(document, provider)
    for where, kind, page in found:
        tally.has_usage |= kind == "usage"
        tally.has_costs |= kind == "costs"
        for b, bucket in enumerate(items(page.get("data"), f"{where}.data")):
            at = f"{where}.data[{b}]"
            bucket = mapping(bucket, at)
            day = day_of(bucket, at)
            tally.days.add(day)
            for r, result in enumerate(items(bucket.get("results"), f"{at}.results")):
                read(tally, day, mapping(result, f"{at}.results[{r}]"), f"{at}.results[{r}]")
    tally.warnings += more_pages(found)
    return tally


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else f"{type(value).__name__} {value!r}"[:80]
