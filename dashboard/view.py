"""What the viewer asked to see: a period of days in their time zone, filters, buckets.

Requests are stored in UTC and rolled up per UTC hour, so a period is cut on whole UTC
hours: exact for every zone whose offset is whole hours; in a zone like Asia/Kolkata
(+05:30) the local midnights are moved back to the hour before, and the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from gateway.db.figures.spend import Scope

HOURLY_UP_TO_DAYS = 3
DAILY_UP_TO_DAYS = 90
Bucket = Literal["hour", "day", "week"]
GRANULARITIES = ("auto", "hour", "day", "week")


def floor_hour(moment: datetime) -> datetime:
    """The start of the UTC hour that ``moment`` falls in."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def local_midnight(day: date, zone: ZoneInfo) -> datetime:
    """The UTC instant a local day starts (DST-correct: zoneinfo resolves it)."""
    return datetime.combine(day, time(), tzinfo=zone).astimezone(UTC)


@dataclass(frozen=True, slots=True)
class View:
    """A period of whole local days, start..end included, with optional filters."""

    zone: ZoneInfo
    start: date
    end: date
    tenant_ids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    # How charts bucket time: "auto" follows the data, else hour, day or week.
    granularity: str = "auto"
    # The hours of the first and last request stored (any tenant: lookups.traffic_span,
    # the start of the first and the end of the last); charts span the traffic in the period.
    traffic: tuple[datetime, datetime] | None = None

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError("the period ends before it starts")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity is one of {GRANULARITIES}")

    @property
    def shown(self) -> tuple[datetime, datetime]:
        """The part of the period the charts span: in "auto", the whole UTC hours from the
        first to the last request in the period (the whole period if it has none)."""
        lower, upper = self.lower, self.upper
        if self.granularity != "auto" or self.traffic is None:
            return lower, upper
        first, last = self.traffic  # whole hours: the first one's start, the last one's end
        first, last = max(floor_hour(first), lower), min(last, upper)
        return (first, last) if first < last else (lower, upper)

    @property
    def bucket(self) -> Bucket:
        """The chosen granularity; in "auto", hours while what is shown spans at most three
        days, days up to 90, weeks beyond."""
        if self.granularity != "auto":
            return self.granularity  # type: ignore[return-value]
        lower, upper = self.shown
        span = upper - lower
        if span <= timedelta(days=HOURLY_UP_TO_DAYS):
            return "hour"
        return "day" if span <= timedelta(days=DAILY_UP_TO_DAYS) else "week"

    @property
    def lower(self) -> datetime:
        """The period's first moment: local midnight of ``start``, floored to the UTC hour."""
        return floor_hour(local_midnight(self.start, self.zone))

    @property
    def upper(self) -> datetime:
        """The period's end, excluded: the local midnight after ``end``, floored to the UTC hour."""
        return floor_hour(local_midnight(self.end + timedelta(days=1), self.zone))

    @property
    def scope(self) -> Scope:
        """The period and the filters, as the scope the figures are summed over."""
        return Scope(self.lower, self.upper, self.tenant_ids, self.models)

    @property
    def days(self) -> int:
        """How many local days the period holds, start and end included."""
        return (self.end - self.start).days + 1

    def previous(self) -> View:
        """The period of as many days just before this one, with the same filters."""
        return replace(
            self,
            start=self.start - timedelta(days=self.days),
            end=self.start - timedelta(days=1),
        )

    def for_tenant(self, tenant_id: str) -> View:
        """This view, narrowed to one tenant."""
        return replace(self, tenant_ids=(tenant_id,))

    @property
    def snapped(self) -> bool:
        """True when local midnight is not on a UTC hour, so bounds moved to the hour."""
        return any(
            local_midnight(day, self.zone) != floor_hour(local_midnight(day, self.zone))
            for day in (self.start, self.end + timedelta(days=1))
        )

    def edges(self) -> list[datetime]:
        """Bucket boundaries in UTC: n + 1 of them for n buckets."""
        lower, upper = self.shown
        if self.bucket == "hour":
            hours = int((upper - lower) / timedelta(hours=1))
            return [lower + timedelta(hours=n) for n in range(hours + 1)]
        # Local days (or weeks of them) from the day of the first shown hour to the end of
        # the period (the last week may be shorter).
        upper = self.upper
        first = max(
            (d for d in self._days() if floor_hour(local_midnight(d, self.zone)) <= lower),
            default=self.start,
        )
        step = 7 if self.bucket == "week" else 1
        edges = []
        day = first
        while (edge := floor_hour(local_midnight(day, self.zone))) < upper:
            edges.append(edge)
            day += timedelta(days=step)
        return [*edges, upper]

    def _days(self) -> list[date]:
        return [self.start + timedelta(days=n) for n in range(self.days)]

    def local(self, moment: datetime) -> datetime:
        """A stored UTC moment in the viewer's zone."""
        return moment.astimezone(self.zone)
