"""What kvgate recorded of its hosted models, per UTC day × upstream, for reconciling
against a provider's bill (``gateway.invoices.compare`` decides which upstreams it billed).

Summed in SQL from the requests table (attempts of every status: a provider bills what it
served, a failed stream's tokens too), with the expressions of ``gateway.db.sums``.
"""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from gateway.db import sums
from gateway.db.models import RequestRow
from gateway.db.sums import Sums

REQUESTS = RequestRow.__table__


def hosted_days(
    session: Session, *, since: datetime, until: datetime
) -> list[tuple[date, str, Sums]]:
    """Per UTC day × upstream, the attempts started in [since, until) on upstreams that are
    not URLs (hosted models by their litellm name; vLLM replicas are URLs), by day then
    upstream."""
    day = _day(session).label("day")
    query = (
        select(day, REQUESTS.c.upstream, *sums.columns(REQUESTS))
        .where(
            REQUESTS.c.started_at >= since,
            REQUESTS.c.started_at < until,
            REQUESTS.c.upstream.not_like("%://%"),
        )
        .group_by(day, REQUESTS.c.upstream)
        .order_by(day, REQUESTS.c.upstream)
    )
    return [
        (date.fromisoformat(row["day"]), row["upstream"], sums.from_row(row))
        for row in session.execute(query).mappings()
    ]


def _day(session: Session) -> ColumnElement[str]:
    """The UTC day of an attempt's start, 'YYYY-MM-DD' on both databases (Postgres sessions
    run in UTC: ``gateway.db.session``)."""
    if session.get_bind().dialect.name == "sqlite":
        return func.strftime("%Y-%m-%d", REQUESTS.c.started_at)
    return func.to_char(REQUESTS.c.started_at, "YYYY-MM-DD")
