"""The scope's traffic by inference endpoint: chat, completions, Responses, Messages, embeddings.

Read from the requests themselves (the hourly rollups have no endpoint): one grouped query
over the scope's rows, per endpoint and the currency of the price entries that priced them
(unpriced attempts apart, with no currency). ``endpoint`` is NULL on records made before
kvgate kept it (migration 0013), which were all chat or completions.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.db.figures.attribution import in_scope
from gateway.db.figures.spend import Scope
from gateway.db.models import PriceRow, RequestRow


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
    query = (
        select(
            RequestRow.endpoint,
            PriceRow.currency,
            func.count(),
            func.sum(RequestRow.uncached_tokens),
            func.sum(RequestRow.cache_read_tokens),
            func.sum(RequestRow.cache_write_tokens),
            func.sum(RequestRow.output_tokens),
            func.sum(RequestRow.cost_total),
        )
        .outerjoin(PriceRow, PriceRow.id == RequestRow.price_id)
        .where(*in_scope(scope))
        .group_by(RequestRow.endpoint, PriceRow.currency)
    )
    found = [
        EndpointFigures(
            endpoint,
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
