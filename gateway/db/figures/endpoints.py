"""The scope's traffic by inference endpoint: chat, completions, Responses, Messages, embeddings.

Read from the hourly ``deployment_hours`` rollup (migration 0016): one grouped query over
the scope's hours, per endpoint and the currency of the price entries that priced them
(unpriced attempts apart, with no currency). The endpoint is None for records made before
kvgate kept it (migration 0013), which were all chat or completions.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.db.figures.spend import Scope
from gateway.db.models import DeploymentHourRow, PriceRow


@dataclass(frozen=True, slots=True)
class EndpointFigures:
    """One endpoint's attempts, tokens by class and cost (in ``currency``; None: unpriced)."""

    endpoint: str | None
    currency: str | None
    requests: int
    uncached_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    cost_total: Decimal

    @property
    def prompt_tokens(self) -> int:
        """All prompt tokens: uncached, read from cache and written to it."""
        return self.uncached_tokens + self.cache_read_tokens + self.cache_write_tokens


def by_endpoint(session: Session, scope: Scope) -> list[EndpointFigures]:
    """The scope's attempts per endpoint and currency, most spent first."""
    table = DeploymentHourRow.__table__
    query = (
        select(
            table.c.endpoint,
            PriceRow.currency,
            func.sum(table.c.requests),
            func.sum(table.c.uncached_tokens),
            func.sum(table.c.cache_read_tokens),
            func.sum(table.c.cache_write_tokens),
            func.sum(table.c.output_tokens),
            func.sum(table.c.cost_total),
        )
        .outerjoin(PriceRow, PriceRow.id == table.c.price_id)
        .where(*scope.where(table))
        .group_by(table.c.endpoint, PriceRow.currency)
    )
    found = [
        EndpointFigures(
            endpoint or None,
            currency,
            int(n),
            int(uncached or 0),
            int(read or 0),
            int(write or 0),
            int(output or 0),
            Decimal(cost or 0),
        )
        for endpoint, currency, n, uncached, read, write, output, cost in session.execute(query)
    ]
    return sorted(found, key=lambda f: (-f.cost_total, -f.requests, f.endpoint or ""))
