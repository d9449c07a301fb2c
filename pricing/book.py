"""The dated price book: which price was in force for a model at a given moment.

Prices are data (``pricing/catalog/*.yaml``), validated on load. The look-up takes the
moment as an argument, so a request is always priced with the entry in force when it
started, and tests are deterministic.

Real price lists need more than four rates, and an entry can say so:

    cache_write_1h   1-hour cache writes (Anthropic), beside the 5-minute ``cache_write``
    long_context     ``above: N`` and its own rates: a prompt of more than N tokens is
                     priced entirely at them (Gemini 2.5 Pro, Claude Sonnet 4 at 200k)
    tiers            service tier name -> rates (priority, flex, batch), used when the
                     response reports that tier
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

CATALOG_DIR = Path(__file__).parent / "catalog"
RATE_FIELDS = ("input", "cache_read", "cache_write", "output")
OPTIONAL_RATES = ("cache_write", "cache_write_1h")
# Names providers report for their ordinary tier: priced with the entry's base rates.
STANDARD_TIERS = frozenset({"", "default", "standard", "auto", "on_demand"})
ZERO = Decimal(0)

# The names of an entry's rate sets besides its tiers (see Price.rate_class).
STANDARD = "standard"
LONG_CONTEXT = "long_context"


class PriceError(ValueError):
    """A price entry that cannot be used."""


@dataclass(frozen=True, slots=True)
class Rates:
    """One set of per-million rates; a missing write rate falls back as ``compute`` says."""

    input: Decimal
    cache_read: Decimal
    output: Decimal
    cache_write: Decimal | None = None
    cache_write_1h: Decimal | None = None

    def to_mapping(self) -> dict[str, str]:
        """Decimal strings, exact, without the rates that are not set."""
        fields = ("input", "cache_read", "cache_write", "cache_write_1h", "output")
        return {f: str(getattr(self, f)) for f in fields if getattr(self, f) is not None}


@dataclass(frozen=True, slots=True)
class LongContext:
    """Rates for a whole request whose prompt is longer than ``above`` tokens."""

    above: int
    rates: Rates


@dataclass(frozen=True, slots=True)
class Price:
    """Rates in force for one model from ``effective_from``: USD (or currency) per 1M tokens."""

    model: str
    effective_from: datetime
    input: Decimal
    cache_read: Decimal
    cache_write: Decimal | None
    output: Decimal
    currency: str = "USD"
    source: str = ""
    captured_on: date | None = None
    cache_write_1h: Decimal | None = None
    long_context: LongContext | None = None
    # (tier name, rates), sorted by name: a tuple keeps the entry hashable and comparable.
    tiers: tuple[tuple[str, Rates], ...] = ()
    # Stable identity: the same model and moment are the same entry everywhere. Derived,
    # and kept (every priced request names it; formatting the moment each time was the
    # top line of the request path's profile).
    id: str = field(init=False, repr=False, compare=False)
    # The dearest prompt rate (input, cache read or either write) and output rate of any of
    # its rate sets: what a budget reserves at (``gateway/serving/admission.py``). Derived
    # once, as ``id`` is: admission asks it of every governed request.
    dearest: tuple[Decimal, Decimal] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", price_id(self.model, self.effective_from))
        sets = [self.base, *(rates for _, rates in self.tiers)]
        if self.long_context is not None:
            sets.append(self.long_context.rates)
        prompt = max(
            max(r.input, r.cache_read, r.cache_write or ZERO, r.cache_write_1h or ZERO)
            for r in sets
        )
        object.__setattr__(self, "dearest", (prompt, max(r.output for r in sets)))

    @property
    def base(self) -> Rates:
        """The entry's base rates, without its long-context rates or tiers."""
        return Rates(
            input=self.input,
            cache_read=self.cache_read,
            output=self.output,
            cache_write=self.cache_write,
            cache_write_1h=self.cache_write_1h,
        )

    def charges_like(self, other: Price) -> bool:
        """Whether two entries charge alike: base rates, long-context rates, tiers and currency."""
        return (self.base, self.long_context, self.tiers, self.currency) == (
            other.base,
            other.long_context,
            other.tiers,
            other.currency,
        )

    def rate_class(self, prompt_tokens: int, tier: str | None = None) -> str:
        """Which of the entry's rate sets prices a request: its service tier's (when listed),
        else ``long_context`` (prompt past the threshold), else ``standard``.

        A tier the entry does not list is priced at the base rates (the request is still
        recorded with its tier, so such requests can be found and re-priced).
        """
        name = (tier or "").strip().lower()
        if name not in STANDARD_TIERS and any(tier_name == name for tier_name, _ in self.tiers):
            return name
        if self.long_context is not None and prompt_tokens > self.long_context.above:
            return LONG_CONTEXT
        return STANDARD

    def rates_named(self, rate_class: str) -> Rates:
        """The rates of one of the entry's rate sets (base for ``standard`` or an unknown name)."""
        if rate_class == LONG_CONTEXT and self.long_context is not None:
            return self.long_context.rates
        for tier_name, rates in self.tiers:
            if tier_name == rate_class:
                return rates
        return self.base

    def rates_for(self, prompt_tokens: int, tier: str | None = None) -> Rates:
        """The rates for one request (see ``rate_class``)."""
        return self.rates_named(self.rate_class(prompt_tokens, tier))

    def variants(self) -> dict[str, Any] | None:
        """The long-context and tier rates as plain data (stored beside the base rates)."""
        data: dict[str, Any] = {}
        if self.long_context is not None:
            data["long_context"] = {
                "above": self.long_context.above,
                **self.long_context.rates.to_mapping(),
            }
        if self.tiers:
            data["tiers"] = {name: rates.to_mapping() for name, rates in self.tiers}
        return data or None


def price_id(model: str, effective_from: datetime) -> str:
    """A price entry's id: its model and start in UTC, ``model@YYYY-MM-DDTHH:MM:SSZ``."""
    return f"{model}@{effective_from.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def parse_moment(value: str | date | datetime) -> datetime:
    """An ISO date or date-time as an aware UTC datetime (a bare date means its midnight UTC)."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    else:
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise PriceError(f"not an ISO date or date-time: {value!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


# Rates are stored as money, Numeric(18, 9): under 10^9 whole units (per million tokens).
MAX_RATE = Decimal(10**9)


def parse_rate(value: Any, field: str) -> Decimal:
    """A non-negative per-million rate as an exact Decimal (YAML floats go through str)."""
    if isinstance(value, bool) or value is None:
        raise PriceError(f"{field}: a rate is required")
    try:
        rate = Decimal(str(value).strip())
    except InvalidOperation as exc:
        raise PriceError(f"{field}: not a number: {value!r}") from exc
    if not rate.is_finite() or rate < 0:
        raise PriceError(f"{field}: must be a finite non-negative number, got {value!r}")
    if rate >= MAX_RATE:
        raise PriceError(f"{field}: must be under {MAX_RATE} per million tokens, got {value!r}")
    return rate


def _currency(value: Any) -> str:
    """An ISO 4217 code, three capital letters: statements and budgets compare them."""
    if not isinstance(value, str) or not (
        len(value) == 3 and value.isascii() and value.isalpha() and value.isupper()
    ):
        raise PriceError(f"currency: an ISO 4217 code such as USD is required, got {value!r}")
    return value


def _optional_rate(entry: Mapping[str, Any], field: str) -> Decimal | None:
    value = entry.get(field)
    return None if value is None else parse_rate(value, field)


def rates_from_mapping(entry: Mapping[str, Any], where: str) -> Rates:
    """One set of rates (input, cache_read and output required)."""
    unknown = set(entry) - {
        "input",
        "cache_read",
        "cache_write",
        "cache_write_1h",
        "output",
        "above",
    }
    if unknown:
        raise PriceError(f"{where}: unknown fields: {sorted(unknown)}")
    return Rates(
        input=parse_rate(entry.get("input"), f"{where}.input"),
        cache_read=parse_rate(entry.get("cache_read"), f"{where}.cache_read"),
        output=parse_rate(entry.get("output"), f"{where}.output"),
        cache_write=_optional_rate(entry, "cache_write"),
        cache_write_1h=_optional_rate(entry, "cache_write_1h"),
    )


def long_context_from(value: Any) -> LongContext | None:
    """Validate an entry's ``long_context`` (None when absent)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PriceError("long_context: expected a mapping with 'above' and rates")
    above = value.get("above")
    if isinstance(above, bool) or not isinstance(above, int) or above < 1:
        raise PriceError("long_context.above: a positive number of prompt tokens is required")
    return LongContext(above=above, rates=rates_from_mapping(value, "long_context"))


def tiers_from(value: Any) -> tuple[tuple[str, Rates], ...]:
    """Validate an entry's ``tiers`` (empty when absent)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise PriceError("tiers: expected a mapping of tier name to rates")
    tiers = []
    for name, rates in value.items():
        key = str(name).strip().lower()
        if key in STANDARD_TIERS:
            raise PriceError(f"tiers.{name}: the standard tier is the entry's own rates")
        if key == LONG_CONTEXT:
            raise PriceError(f"tiers.{name}: long-context rates go under 'long_context'")
        if not isinstance(rates, Mapping) or "above" in rates:
            raise PriceError(f"tiers.{name}: expected a mapping of rates")
        tiers.append((key, rates_from_mapping(rates, f"tiers.{key}")))
    return tuple(sorted(tiers))


def price_from_mapping(entry: Mapping[str, Any]) -> Price:
    """Validate one catalog entry."""
    unknown = set(entry) - {
        "model",
        "effective_from",
        *RATE_FIELDS,
        "currency",
        "source",
        "captured_on",
        "cache_write_1h",
        "long_context",
        "tiers",
    }
    if unknown:
        raise PriceError(f"unknown fields: {sorted(unknown)}")
    model = entry.get("model")
    if not isinstance(model, str) or not model.strip():
        raise PriceError("model: a non-empty name is required")
    if "effective_from" not in entry:
        raise PriceError(f"{model}: effective_from is required")
    cache_write = entry.get("cache_write")
    captured = entry.get("captured_on")
    return Price(
        model=model.strip(),
        effective_from=parse_moment(entry["effective_from"]),
        input=parse_rate(entry.get("input"), "input"),
        cache_read=parse_rate(entry.get("cache_read"), "cache_read"),
        cache_write=None if cache_write is None else parse_rate(cache_write, "cache_write"),
        output=parse_rate(entry.get("output"), "output"),
        currency=_currency(entry.get("currency", "USD")),
        source=str(entry.get("source", "")),
        captured_on=None if captured is None else parse_moment(captured).date(),
        cache_write_1h=_optional_rate(entry, "cache_write_1h"),
        long_context=long_context_from(entry.get("long_context")),
        tiers=tiers_from(entry.get("tiers")),
    )


def load_catalog(directory: Path = CATALOG_DIR) -> list[Price]:
    """Every entry of every ``*.yaml`` file in the catalog directory, validated."""
    prices: list[Price] = []
    for path in sorted(directory.glob("*.yaml")):
        document = yaml.safe_load(path.read_text()) or {}
        entries = document.get("prices", []) if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise PriceError(f"{path.name}: expected a mapping with a 'prices' list")
        for number, entry in enumerate(entries, start=1):
            if not isinstance(entry, Mapping):
                raise PriceError(f"{path.name} entry {number}: expected a mapping")
            try:
                prices.append(price_from_mapping(entry))
            except PriceError as exc:
                raise PriceError(f"{path.name} entry {number}: {exc}") from exc
    return prices


class PriceBook:
    """Dated prices per model; ``price_for(model, at=...)`` is the only look-up."""

    def __init__(self, prices: Iterable[Price] = ()) -> None:
        by_model: dict[str, dict[datetime, Price]] = {}
        for price in prices:
            entries = by_model.setdefault(price.model, {})
            if price.effective_from in entries and entries[price.effective_from] != price:
                raise PriceError(f"two different prices for {price.id}")
            entries[price.effective_from] = price
        self._entries = {
            model: sorted(entries.values(), key=lambda p: p.effective_from)
            for model, entries in by_model.items()
        }
        self._starts = {m: [p.effective_from for p in e] for m, e in self._entries.items()}

    def price_for(self, model: str, *, at: datetime) -> Price | None:
        """The entry with the latest ``effective_from`` not after ``at``, or None."""
        starts = self._starts.get(model)
        if not starts:
            return None
        index = bisect.bisect_right(starts, at) - 1
        return self._entries[model][index] if index >= 0 else None

    def in_force(self, model: str, *, at: datetime) -> tuple[Price | None, datetime | None]:
        """``price_for``, and when the model's next entry takes over (None: no later one)."""
        starts = self._starts.get(model)
        if not starts:
            return None, None
        index = bisect.bisect_right(starts, at)
        after = starts[index] if index < len(starts) else None
        return (self._entries[model][index - 1] if index > 0 else None), after

    def entries(self, model: str | None = None) -> list[Price]:
        """The model's entries (every model's, by name, if None), oldest first."""
        models = [model] if model is not None else sorted(self._entries)
        return [p for m in models for p in self._entries.get(m, [])]

    def __len__(self) -> int:
        return sum(len(e) for e in self._entries.values())
