"""Cost of one request: exact Decimal money per token class, at the nano-dollar."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from gateway.usage import Usage
from pricing.book import Price

NANO = Decimal("0.000000001")
PER_MILLION = Decimal(1_000_000)
ZERO = Decimal("0.000000000")


def money(tokens: int, rate_per_million: Decimal) -> Decimal:
    """tokens × rate / 1M, rounded half-even to the nano-dollar (Numeric(18, 9))."""
    return (Decimal(tokens) * rate_per_million / PER_MILLION).quantize(NANO, ROUND_HALF_EVEN)


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
        return self.uncached + self.cache_read + self.cache_write + self.output

    @property
    def saved(self) -> Decimal:
        """What the cache saved against paying the input rate for every prompt token."""
        return self.uncached_equivalent - self.total


def compute(usage: Usage, price: Price) -> Cost:
    """Price each token class with its own rate.

    Cache writes are billed at the cache-write rate where the price has one, else as plain
    input (a provider that does not bill writes separately charges them as prefill).
    """
    write_rate = price.cache_write if price.cache_write is not None else price.input
    return Cost(
        uncached=money(usage.uncached_tokens, price.input),
        cache_read=money(usage.cache_read_tokens, price.cache_read),
        cache_write=money(usage.cache_write_tokens, write_rate),
        output=money(usage.output_tokens, price.output),
        uncached_equivalent=money(usage.prompt_tokens, price.input)
        + money(usage.output_tokens, price.output),
    )
