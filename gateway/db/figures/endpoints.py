"""The scope's traffic by inference endpoint: chat, completions, Responses, Messages, embeddings.

Read from the requests themselves (the hourly rollups have no endpoint): one grouped query
over the scope's rows, per endpoint and the currency of the price entries that priced them
(unpriced attempts apart, with no currency). ``endpoint`` is NULL on records made before
kvgate kept it (migration 0013), which were all chat or completions.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db import sums
from gateway.db.figures.attribution import in_scope
from gateway.db.figures.spend import Scope
from gateway.db.models import PriceRow, RequestRow
from gateway.db.sums import Sums

REQUESTS = RequestRow.__table__


@dataclass(frozen=True, slots=True)
class EndpointFigures:
    """One endpoint's attempts, tokens by class and cost (in ``currency``; None: unpriced)."""

    endpoint: str | None
    currency: str | None
    sums: Sums


def by_endpoint(session: Session, scope: Scope) -> list[EndpointFigures]:
    """The scope's attempts per endpoint and currency, most spent first."""
    query = (
        select(REQUESTS.c.endpoint, PriceRow.currency, *sums.columns(REQUESTS))
        .outerjoin(PriceRow, PriceRow.id == REQUESTS.c.price_id)
        .where(*in_scope(scope))
        .group_by(REQUESTS.c.endpoint, PriceRow.currency)
    )
    found = [
        EndpointFigures(row["endpoint"], row["currency"], sums.from_row(row))
        for row in session.execute(query).mappings()
    ]
    return sorted(found, key=lambda f: (-f.sums.cost_total, -f.sums.requests, f.endpoint or ""))
