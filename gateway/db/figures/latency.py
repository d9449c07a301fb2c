"""Time to first token from the hourly TTFT histograms (``gateway.db.writer.rollups``).

Cold requests had no cached tokens, warm ones had some; percentiles come from bucket
histograms summed in SQL, so they cost the same at a thousand records or a million.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from gateway.db.figures.spend import Scope, bucket_index
from gateway.db.models import TtftHourRow
from gateway.db.writer.rollups import bucket_upper_ms

TTFT = TtftHourRow.__table__


@dataclass(frozen=True, slots=True)
class Ttft:
    """Time to first token, cold (no cached tokens) and warm, from the histogram.

    A percentile is the upper edge of the bucket holding its nearest rank (buckets are
    eight per doubling, so it overstates by at most about 9 %).
    """

    cold_requests: int = 0
    cold_p50_ms: float | None = None
    cold_p90_ms: float | None = None
    warm_requests: int = 0
    warm_p50_ms: float | None = None
    warm_p90_ms: float | None = None


def percentile_ms(histogram: dict[int, int], p: float) -> float | None:
    """Nearest-rank percentile of a bucket histogram, as the bucket's upper edge."""
    total = sum(histogram.values())
    if not total:
        return None
    rank, seen = math.ceil(p * total), 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket_upper_ms(bucket)
    raise AssertionError("unreachable: ranks never exceed the total")


def _ttft(histograms: dict[bool, dict[int, int]]) -> Ttft:
    cold, warm = histograms.get(False, {}), histograms.get(True, {})
    return Ttft(
        cold_requests=sum(cold.values()),
        cold_p50_ms=percentile_ms(cold, 0.5),
        cold_p90_ms=percentile_ms(cold, 0.9),
        warm_requests=sum(warm.values()),
        warm_p50_ms=percentile_ms(warm, 0.5),
        warm_p90_ms=percentile_ms(warm, 0.9),
    )


def _ttft_query(scope: Scope) -> Select[Any]:
    return (
        select(TTFT.c.warm, TTFT.c.bucket, func.sum(TTFT.c.requests))
        .where(*scope.where(TTFT))
        .group_by(TTFT.c.warm, TTFT.c.bucket)
    )


def ttft(session: Session, scope: Scope) -> Ttft:
    """TTFT percentiles of the scope."""
    histograms: dict[bool, dict[int, int]] = defaultdict(dict)
    for warm, bucket, count in session.execute(_ttft_query(scope)):
        histograms[bool(warm)][bucket] = int(count)
    return _ttft(histograms)


def ttft_trend(
    session: Session, scope: Scope, edges: Sequence[datetime]
) -> tuple[Ttft, list[tuple[datetime, Ttft]]]:
    """TTFT percentiles of the whole scope and per time bucket, from one scan.

    The hours are put in their buckets in SQL (``bucket_index``): a few rows per bucket
    come back, not one per hour × bucket of the histogram.
    """
    index = bucket_index(TTFT.c.hour, edges).label("at")
    query = (
        select(index, TTFT.c.warm, TTFT.c.bucket, func.sum(TTFT.c.requests))
        .where(*scope.where(TTFT))
        .group_by(index, TTFT.c.warm, TTFT.c.bucket)
    )
    overall: dict[bool, dict[int, int]] = defaultdict(dict)
    per_bucket: dict[int, dict[bool, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    for at, warm, bucket, count in session.execute(query):
        histogram = overall[bool(warm)]
        histogram[bucket] = histogram.get(bucket, 0) + int(count)
        if at is not None:
            per_bucket[int(at)][bool(warm)][bucket] = int(count)
    return _ttft(overall), [
        (start, _ttft(per_bucket.get(n, {}))) for n, start in enumerate(edges[:-1])
    ]
