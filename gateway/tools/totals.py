"""What kvgate recorded for a tenant, as its billing statement's ``totals`` give it, and
what changed between two reads: how the tools that send requests (cachetest, replay's
live mode) check them against kvgate's records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any

from pricing.cost import ZERO

INPUT_COSTS = ("cost_uncached", "cost_cache_read", "cost_cache_write")


@dataclass(frozen=True, slots=True)
class StatementTotals:
    """A statement's totals (or the difference of two): tokens per class and cost."""

    requests: int
    uncached_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    cost_input: Decimal  # uncached + cache read + cache write
    cost_total: Decimal

    @classmethod
    def of(cls, statement: Mapping[str, Any]) -> StatementTotals:
        """The totals of a statement (its JSON, as /v1/billing/statement answers)."""
        totals = statement["totals"]
        return cls(
            requests=int(totals["requests"]),
            uncached_tokens=int(totals["uncached_tokens"]),
            cache_read_tokens=int(totals["cache_read_tokens"]),
            cache_write_tokens=int(totals["cache_write_tokens"]),
            output_tokens=int(totals["output_tokens"]),
            cost_input=sum((Decimal(totals[name]) for name in INPUT_COSTS), ZERO),
            cost_total=Decimal(totals["cost_total"]),
        )

    def minus(self, before: StatementTotals) -> StatementTotals:
        """The totals recorded since ``before``."""
        return StatementTotals(
            **{f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self)}
        )

    @property
    def prompt_tokens(self) -> int:
        """Uncached, cache-read and cache-write tokens: the whole prompts."""
        return self.uncached_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def token_hit_rate(self) -> float:
        """Cache-read tokens over prompt tokens; 0.0 without prompt tokens."""
        return self.cache_read_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
