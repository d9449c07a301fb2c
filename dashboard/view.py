"""What the viewer asked to see: a period of days in their time zone, filters, buckets.

Requests are stored in UTC and rolled up per UTC hour, so a period is cut on whole UTC
hours: exact for every zone whose offset is whole hours; in a zone like Asia/Kolkata
(+05:30) the local midnights are moved back to the hour before, and the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from gateway.db.figures.spend import Scope

HOURLY_UP_TO_DAYS = 3
Bucket = Literal["hour", "day"]


def floor_hour(moment: datetime) -> datetime:
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

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError("the period ends before it starts")

    @property
    def bucket(self) -> Bucket:
        """Hours for short periods, days otherwise."""
        return "hour" if (self.end - self.start).days < HOURLY_UP_TO_DAYS else "day"

    @property
    def lower(self) -> datetime:
        return floor_hour(local_midnight(self.start, self.zone))

    @property
    def upper(self) -> datetime:
        return floor_hour(local_midnight(self.end + timedelta(days=1), self.zone))

    @property
    def scope(self) -> Scope:
        return Scope(self.lower, self.upper, self.tenant_ids, self.models)

    def for_tenant(self, tenant_id: str) -> View:
        return View(self.zone, self.start, self.end, (tenant_id,), self.models)

    @property
    def snapped(self) -> bool:
        """True when local midnight is not on a UTC hour, so bounds moved to the hour."""
        return any(
            local_midnight(day, self.zone) != floor_hour(local_midnight(day, self.zone))
            for day in (self.start, self.end + timedelta(days=1))
        )

    def edges(self) -> list[datetime]:
        """Bucket boundaries in UTC: n + 1 of them for n buckets."""
        if self.bucket == "hour":
            hours = int((self.upper - self.lower) / timedelta(hours=1))
            return [self.lower + timedelta(hours=n) for n in range(hours + 1)]
        days = (self.end - self.start).days + 1
        return [
            floor_hour(local_midnight(self.start + timedelta(days=n), self.zone))
            for n in range(days + 1)
        ]

    def local(self, moment: datetime) -> datetime:
        """A stored UTC moment in the viewer's zone."""
        return moment.astimezone(self.zone)
