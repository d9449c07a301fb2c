"""What one tenant's clients saw, summed by endpoint, and the check that the tenant's
billing statement says exactly the same: a line per endpoint, its tokens by class, its
requests and its cost to the nano-dollar, and the statement's total.

    seen = Seen()
    seen.add("/v1/responses", uncached=120, cached=96, output=5, cost=usage_cost)
    seen.check(stack.statement("gamma"))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

TOKEN_CLASSES = ("uncached_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")


@dataclass
class Line:
    """One endpoint's figures as the clients saw them."""

    requests: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_CLASSES, 0))
    cost: Decimal = Decimal(0)


@dataclass
class Seen:
    """Every billed answer one tenant's clients received, by endpoint."""

    lines: dict[str, Line] = field(default_factory=dict)

    def add(
        self,
        endpoint: str,
        *,
        uncached: int,
        cached: int,
        output: int,
        cost: Any,
        cache_write: int = 0,
    ) -> None:
        """One answer: its tokens by class and the cost it carried (a decimal string)."""
        line = self.lines.setdefault(endpoint, Line())
        line.requests += 1
        for name, value in zip(TOKEN_CLASSES, (uncached, cached, cache_write, output), strict=True):
            line.tokens[name] += value
        line.cost += Decimal(cost)

    @property
    def cost(self) -> Decimal:
        return sum((line.cost for line in self.lines.values()), Decimal(0))

    def check(self, statement: Mapping[str, Any]) -> None:
        """The statement has one line per endpoint seen and no other, each with exactly the
        figures seen, and their total."""
        by_endpoint: dict[str, list[Mapping[str, Any]]] = {}
        for item in statement["line_items"]:
            by_endpoint.setdefault(item["endpoint"], []).append(item)
        assert sorted(by_endpoint) == sorted(self.lines), statement["line_items"]
        for endpoint, line in self.lines.items():
            (item,) = by_endpoint[endpoint]
            stated = {name: item[name] for name in TOKEN_CLASSES}
            assert (item["requests"], stated, Decimal(item["cost_total"])) == (
                line.requests,
                line.tokens,
                line.cost,
            ), endpoint
        assert Decimal(statement["totals"]["cost_total"]) == self.cost
