"""Cost of one request: exact Decimal money per token class, at the nano-dollar.

The token counts come in as any value with the four classes (``gateway.usage.Usage`` is
one): the price book depends on nothing of the gateway's.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Protocol

from pricing.book import Price, Rates


class Tokens(Protocol):
    """A request's tokens in the four disjoint classes priced differently."""

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens neither read from nor written to the cache."""

    @property
    def cache_read_tokens(self) -> int:
        """Prompt tokens read from the cache."""

    @property
    def cache_write_tokens(self) -> int:
        """Prompt tokens written to the cache, the 1-hour writes included."""

    @property
    def cache_write_1h_tokens(self) -> int:
        """Of the tokens written to the cache, those written for an hour."""

    @property
    def output_tokens(self) -> int:
        """Tokens generated."""

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of every class: uncached, cache read and cache write."""


NANO = Decimal("0.000000001")
PER_MILLION = Decimal(1_000_000)
ZERO = Decimal("0.000000000")


def money(tokens: int, rate_per_million: Decimal) -> Decimal:
    """tokens × rate / 1M, rounded half-even to the nano-dollar (Numeric(18, 9))."""
    # rate × int: the int converted exactly, as Decimal(tokens) would be, without the call
    return (rate_per_million * tokens / PER_MILLION).quantize(NANO, ROUND_HALF_EVEN)


# ``money`` in integers, for the hot path (admission's largest cost): a rate as nano-dollars
# per token, a fraction (numerator, denominator a power of ten), where its products stay
# exact in Decimal: a rate's digits under 10^12, its value under 10^6 per million tokens,
# and the tokens under ``NANO_TOKENS`` (then ``money`` neither rounds the product to 28
# digits nor overflows its quantize, and ``money_nanos`` is exactly ``money`` x 10^9).
NANO_TOKENS = 10**15


def nano_rate(rate_per_million: Decimal) -> tuple[int, int] | None:
    """A rate as (numerator, denominator) nano-dollars per token; None where ``money_nanos``
    would not be exact (a rate too large, too long, or not finite)."""
    if not rate_per_million.is_finite() or abs(rate_per_million) >= PER_MILLION:
        return None
    sign, digits, exponent = rate_per_million.as_tuple()
    assert isinstance(exponent, int)
    coefficient = int("".join(map(str, digits)) or "0")
    if coefficient >= 10**12:
        return None
    if sign:
        coefficient = -coefficient
    shift = exponent + 3  # nano-dollars per token: rate x 10^9 / 10^6
    if shift >= 0:
        return coefficient * 10**shift, 1
    return coefficient, 10**-shift


def money_nanos(tokens: int, rate: tuple[int, int]) -> int:
    """``money`` in nano-dollars (half-even), for a rate from ``nano_rate`` and fewer than
    ``NANO_TOKENS`` tokens either way (the caller checks)."""
    numerator, denominator = rate
    product = tokens * numerator
    return product if denominator == 1 else divide_half_even(product, denominator)


def divide_half_even(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` (a positive denominator) rounded half-even to an int."""
    quotient, rest = divmod(numerator, denominator)
    if rest * 2 > denominator or (rest * 2 == denominator and quotient & 1):
        quotient += 1
    return quotient


@dataclass(frozen=True, slots=True)
class Cost:
    """What one request cost, per class; ``total`` is the exact sum of the classes."""

    uncached: Decimal = ZERO
    cache_read: Decimal = ZERO
    cache_write: Decimal = ZERO
    output: Decimal = ZERO
    uncached_equivalent: Decimal = ZERO

    @property
    def total(self) -> Decimal:
        """The exact sum of the classes."""
        return self.uncached + self.cache_read + self.cache_write + self.output

    @property
    def saved(self) -> Decimal:
        """What the cache saved against paying the input rate for every prompt token."""
        return self.uncached_equivalent - self.total


def write_rates(rates: Rates) -> tuple[Decimal, Decimal]:
    """The (5-minute, 1-hour) cache-write rates as applied: statements show these.

    A missing write rate falls back to plain input (a provider that does not bill writes
    separately charges them as prefill); a missing 1-hour rate falls back to the 5-minute one.
    A rate of 0 is a rate: only a missing one (None) falls back.
    """
    five_minute = rates.cache_write if rates.cache_write is not None else rates.input
    one_hour = rates.cache_write_1h if rates.cache_write_1h is not None else five_minute
    return five_minute, one_hour


def write_cost(usage: Tokens, rates: Rates) -> Decimal:
    """Cache writes: 5-minute and 1-hour at their ``write_rates``, rounded once."""
    five_minute, one_hour = write_rates(rates)
    hour = usage.cache_write_1h_tokens
    exact = Decimal(usage.cache_write_tokens - hour) * five_minute + Decimal(hour) * one_hour
    return (exact / PER_MILLION).quantize(NANO, ROUND_HALF_EVEN)


def compute(usage: Tokens, price: Price, *, tier: str | None = None) -> Cost:
    """Price each token class with its own rate.

    The rates are the entry's for the request's service tier, or its long-context rates when
    the whole prompt (uncached + cache read + cache write) is past the entry's threshold.
    """
    return cost_at(usage, price.rates_for(usage.prompt_tokens, tier))


def cost_at(usage: Tokens, rates: Rates) -> Cost:
    """Price each token class at one set of rates (``compute`` once the rates are chosen)."""
    return Cost(
        uncached=money(usage.uncached_tokens, rates.input),
        cache_read=money(usage.cache_read_tokens, rates.cache_read),
        cache_write=write_cost(usage, rates),
        output=money(usage.output_tokens, rates.output),
        uncached_equivalent=money(usage.prompt_tokens, rates.input)
        + money(usage.output_tokens, rates.output),
    )
