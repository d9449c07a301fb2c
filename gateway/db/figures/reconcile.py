"""Reconciliation against the engine: per vLLM replica and window, the prompt and cached
tokens kvgate recorded against the replica's own counters.

The counters are the replica's /metrics (``vllm:prompt_tokens``, ``vllm:prefix_cache_hits``,
``vllm:prefix_cache_queries``, ``vllm:generation_tokens``), read by every gateway worker's
load poller and stored as samples (``replica_samples``: upstream, sampler, moment, values).
A window's engine figures are the deltas between two samples of one sampler: the last
taken at or before the window's start (or, where there is none, the first inside it) and
the last at or before its end. A counter that went back means the replica restarted; the
delta is then taken from zero, and the window says so (what it counted between the sample
before and its restart is lost to its counters, not to kvgate's records).

Windows align with records by the samples themselves: a window's records are the attempts
placed on that replica that started after the first sample and at or before the last, so
the two sides cover the same span to the microsecond. What remains is a request started
just before a sample and prefilled just after (queued at the replica): counted by kvgate
in one window and by the replica in the next. Over an hour that is noise; a test that
leaves the replica idle around its samples reconciles exactly.

Records are summed from the ``replica_hours`` rollup for the whole hours of the span and
from the requests table only for the edges (each at most half an hour, through the index on
``started_at``), so a day of windows at a million records is a few small queries.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from gateway.db.models import ReplicaHourRow, ReplicaSampleRow, RequestRow
from gateway.db.writer.rollups import hour_of

WINDOW = timedelta(hours=1)
DRIFT_LIMIT = Decimal("0.01")  # more than 1 % apart: said, counted, logged
HOUR = timedelta(hours=1)
SAMPLES = ReplicaSampleRow.__table__
REPLICAS = ReplicaHourRow.__table__
REQUESTS = RequestRow.__table__


@dataclass(frozen=True, slots=True)
class Counted:
    """What a replica's counters moved by over a window (tokens)."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Recorded:
    """What kvgate recorded of the attempts placed on a replica over a window."""

    requests: int = 0
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Recorded) -> Recorded:
        return Recorded(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.output_tokens + other.output_tokens,
        )

    def __sub__(self, other: Recorded) -> Recorded:
        return Recorded(
            self.requests - other.requests,
            self.prompt_tokens - other.prompt_tokens,
            self.cache_read_tokens - other.cache_read_tokens,
            self.output_tokens - other.output_tokens,
        )


def drift(recorded: int, counted: int) -> Decimal | None:
    """(recorded - counted) / counted; None when the replica counted nothing."""
    return None if counted == 0 else Decimal(recorded - counted) / Decimal(counted)


@dataclass(frozen=True, slots=True)
class Reconciled:
    """One replica over one window: its counters against kvgate's records."""

    upstream: str
    start: datetime  # the window asked for: [start, end)
    end: datetime
    sampled_from: datetime  # the two samples the figures are between
    sampled_to: datetime
    sampler: str
    restarted: bool
    engine: Counted
    recorded: Recorded

    @property
    def prompt_drift(self) -> Decimal | None:
        """Recorded prompt tokens against ``vllm:prompt_tokens``."""
        return drift(self.recorded.prompt_tokens, self.engine.prompt_tokens)

    @property
    def cached_drift(self) -> Decimal | None:
        """Recorded cached tokens against ``vllm:prefix_cache_hits``."""
        return drift(self.recorded.cache_read_tokens, self.engine.prefix_cache_hits)

    def over(self, limit: Decimal = DRIFT_LIMIT) -> list[str]:
        """Which of prompt and cached tokens are more than ``limit`` apart (a side that
        counted nothing while the other did is apart too)."""
        apart = []
        for name, mine, theirs in (
            ("prompt", self.recorded.prompt_tokens, self.engine.prompt_tokens),
            ("cached", self.recorded.cache_read_tokens, self.engine.prefix_cache_hits),
        ):
            ratio = drift(mine, theirs)
            if (ratio is None and mine) or (ratio is not None and abs(ratio) > limit):
                apart.append(name)
        return apart


Reading = tuple[datetime, tuple[int, int, int, int]]


def windows(since: datetime, until: datetime, size: timedelta) -> list[tuple[datetime, datetime]]:
    """[since, until) cut into windows of ``size`` (the last one may be shorter)."""
    if size <= timedelta(0):
        raise ValueError("a window lasts longer than nothing")
    out, start = [], since
    while start < until:
        out.append((start, min(start + size, until)))
        start += size
    return out


def reconcile(
    session: Session,
    *,
    since: datetime,
    until: datetime,
    window: timedelta = WINDOW,
    upstreams: Sequence[str] = (),
) -> list[Reconciled]:
    """Every replica with samples, per window of [since, until), by replica then time."""
    series = _readings(session, since, until, upstreams)
    chosen: list[tuple[str, datetime, datetime, str, list[Reading]]] = []
    for upstream in sorted({u for u, _ in series}):
        samplers = {s: r for (u, s), r in series.items() if u == upstream}
        for start, end in windows(since, until, window):
            pick = _pick(samplers, start, end)
            if pick is not None:
                chosen.append((upstream, start, end, *pick))
    moments = {(u, r[0][0]) for u, *_, r in chosen} | {(u, r[-1][0]) for u, *_, r in chosen}
    cumulative = _cumulative(session, moments)
    out = []
    for upstream, start, end, sampler, readings in chosen:
        counted, restarted = _deltas(readings)
        recorded = cumulative[(upstream, readings[-1][0])] - cumulative[(upstream, readings[0][0])]
        out.append(
            Reconciled(
                upstream,
                start,
                end,
                readings[0][0],
                readings[-1][0],
                sampler,
                restarted,
                counted,
                recorded,
            )
        )
    return out


def _readings(
    session: Session, since: datetime, until: datetime, upstreams: Sequence[str]
) -> dict[tuple[str, str], list[Reading]]:
    """Per (upstream, sampler): its samples in (since, until], after its last one at or
    before ``since``, in time order."""
    chosen = [SAMPLES.c.upstream.in_(upstreams)] if upstreams else []
    last = (
        select(SAMPLES.c.upstream, SAMPLES.c.sampler, func.max(SAMPLES.c.sampled_at).label("at"))
        .where(SAMPLES.c.sampled_at <= since, *chosen)
        .group_by(SAMPLES.c.upstream, SAMPLES.c.sampler)
        .subquery()
    )
    columns = (
        SAMPLES.c.upstream,
        SAMPLES.c.sampler,
        SAMPLES.c.sampled_at,
        SAMPLES.c.prefix_cache_queries,
        SAMPLES.c.prefix_cache_hits,
        SAMPLES.c.prompt_tokens,
        SAMPLES.c.generation_tokens,
    )
    before = select(*columns).join(
        last,
        and_(
            SAMPLES.c.upstream == last.c.upstream,
            SAMPLES.c.sampler == last.c.sampler,
            SAMPLES.c.sampled_at == last.c.at,
        ),
    )
    inside = select(*columns).where(
        SAMPLES.c.sampled_at > since, SAMPLES.c.sampled_at <= until, *chosen
    )
    series: dict[tuple[str, str], list[Reading]] = defaultdict(list)
    for query in (before, inside):
        for upstream, sampler, at, queries, hits, prompt, generation in session.execute(query):
            counters = (int(queries), int(hits), int(prompt), int(generation))
            series[(upstream, sampler)].append((at, counters))
    for readings in series.values():
        readings.sort(key=lambda reading: reading[0])
    return dict(series)


def _pick(
    samplers: dict[str, list[Reading]], start: datetime, end: datetime
) -> tuple[str, list[Reading]] | None:
    """The sampler whose samples cover most of [start, end], and its samples from the one
    opening the window to the one closing it."""
    best: tuple[timedelta, str, list[Reading]] | None = None
    for name in sorted(samplers):
        readings = samplers[name]
        times = [at for at, _ in readings]
        first = bisect.bisect_right(times, start) - 1  # last sample at or before the start
        if first < 0:
            first = 0  # none before: the window starts at its first sample inside
        last = bisect.bisect_right(times, end) - 1  # last sample at or before the end
        if last <= first:
            continue
        covered = min(times[last], end) - max(times[first], start)
        if best is None or covered > best[0]:
            best = (covered, name, readings[first : last + 1])
    return None if best is None else (best[1], best[2])


def _deltas(readings: Sequence[Reading]) -> tuple[Counted, bool]:
    """How far the counters moved along the samples; a counter that went back is a replica
    that restarted (counting from zero again)."""
    totals, restarted = [0, 0, 0, 0], False
    for (_, earlier), (_, later) in pairwise(readings):
        went_back = any(b < a for a, b in zip(earlier, later, strict=True))
        restarted = restarted or went_back
        for index, (a, b) in enumerate(zip(earlier, later, strict=True)):
            totals[index] += b if went_back else b - a
    return Counted(*totals), restarted


def _cumulative(
    session: Session, moments: Iterable[tuple[str, datetime]]
) -> dict[tuple[str, datetime], Recorded]:
    """Per (upstream, moment): what the replica's attempts started up to that moment add up
    to (counted from the first hour involved: only differences mean anything)."""
    wanted = sorted(set(moments))
    if not wanted:
        return {}
    upstreams = sorted({u for u, _ in wanted})
    lowest = min(hour_of(t) for _, t in wanted)
    highest = max(hour_of(t) for _, t in wanted) + HOUR
    rolled = session.execute(
        select(
            REPLICAS.c.upstream,
            REPLICAS.c.hour,
            func.sum(REPLICAS.c.requests),
            func.sum(REPLICAS.c.prompt_tokens),
            func.sum(REPLICAS.c.cache_read_tokens),
            func.sum(REPLICAS.c.output_tokens),
        )
        .where(
            REPLICAS.c.upstream.in_(upstreams),
            REPLICAS.c.hour >= lowest,
            REPLICAS.c.hour <= highest,
        )
        .group_by(REPLICAS.c.upstream, REPLICAS.c.hour)
    )
    hourly: dict[str, dict[datetime, Recorded]] = defaultdict(dict)
    for upstream, hour, *values in rolled:
        hourly[upstream][hour] = Recorded(*(int(v or 0) for v in values))

    def before(upstream: str, hour: datetime) -> Recorded:
        """The upstream's attempts started in [lowest, hour)."""
        total = Recorded()
        for at, sums in hourly[upstream].items():
            if at < hour:
                total += sums
        return total

    out: dict[tuple[str, datetime], Recorded] = {}
    by_moment: dict[datetime, list[str]] = defaultdict(list)
    for upstream, moment in wanted:
        by_moment[moment].append(upstream)
    for moment, named in by_moment.items():
        hour = hour_of(moment)
        # From whichever end of its hour the moment is nearer: at most half an hour of rows.
        early = moment - hour <= HOUR / 2
        raw = _raw(session, named, hour, moment) if early else _raw_after(session, named, moment)
        for upstream in named:
            edge = raw.get(upstream, Recorded())
            if early:
                out[(upstream, moment)] = before(upstream, hour) + edge
            else:
                out[(upstream, moment)] = before(upstream, hour + HOUR) - edge
    return out


def _sums() -> list[Any]:
    prompt = REQUESTS.c.uncached_tokens + REQUESTS.c.cache_read_tokens
    return [
        func.count(),
        func.sum(prompt + REQUESTS.c.cache_write_tokens),
        func.sum(REQUESTS.c.cache_read_tokens),
        func.sum(REQUESTS.c.output_tokens),
    ]


def _raw(
    session: Session, upstreams: Sequence[str], lower: datetime, moment: datetime
) -> dict[str, Recorded]:
    """Attempts started in [lower, moment], per upstream."""
    query = (
        select(REQUESTS.c.upstream, *_sums())
        .where(
            REQUESTS.c.started_at >= lower,
            REQUESTS.c.started_at <= moment,
            REQUESTS.c.upstream.in_(upstreams),
        )
        .group_by(REQUESTS.c.upstream)
    )
    return {u: Recorded(*(int(v or 0) for v in values)) for u, *values in session.execute(query)}


def _raw_after(session: Session, upstreams: Sequence[str], moment: datetime) -> dict[str, Recorded]:
    """Attempts started after ``moment`` and before the end of its hour, per upstream."""
    query = (
        select(REQUESTS.c.upstream, *_sums())
        .where(
            REQUESTS.c.started_at > moment,
            REQUESTS.c.started_at < hour_of(moment) + HOUR,
            REQUESTS.c.upstream.in_(upstreams),
        )
        .group_by(REQUESTS.c.upstream)
    )
    return {u: Recorded(*(int(v or 0) for v in values)) for u, *values in session.execute(query)}
