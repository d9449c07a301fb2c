"""Chart granularity follows the data: hourly while the traffic shown spans at most three
days, daily up to 90, weekly beyond; the viewer can choose one instead."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from dashboard.view import View

UTC_ZONE = ZoneInfo("UTC")


def hours(first: datetime, count: int) -> list[datetime]:
    return [first + timedelta(hours=n) for n in range(count + 1)]


def test_a_fresh_day_in_a_week_is_drawn_by_the_hour_over_its_traffic_alone() -> None:
    traffic = (datetime(2026, 7, 7, 9, tzinfo=UTC), datetime(2026, 7, 7, 15, tzinfo=UTC))
    view = View(UTC_ZONE, date(2026, 7, 1), date(2026, 7, 7), traffic=traffic)
    assert view.bucket == "hour"
    assert view.edges() == hours(datetime(2026, 7, 7, 9, tzinfo=UTC), 6)
    # The figures still cover the whole period; only the charts are narrowed.
    assert (view.scope.lower, view.scope.upper) == (
        datetime(2026, 7, 1, tzinfo=UTC),
        datetime(2026, 7, 8, tzinfo=UTC),
    )


def test_traffic_outside_the_period_is_cut_to_it() -> None:
    traffic = (datetime(2026, 6, 1, tzinfo=UTC), datetime(2026, 7, 2, 5, tzinfo=UTC))
    view = View(UTC_ZONE, date(2026, 7, 1), date(2026, 7, 1), traffic=traffic)
    assert view.shown == (datetime(2026, 7, 1, tzinfo=UTC), datetime(2026, 7, 2, tzinfo=UTC))
    assert view.edges() == hours(datetime(2026, 7, 1, tzinfo=UTC), 24)


@pytest.mark.parametrize(
    ("days", "bucket"), [(3, "hour"), (4, "day"), (90, "day"), (91, "week"), (365, "week")]
)
def test_the_span_shown_picks_the_bucket(days: int, bucket: str) -> None:
    start = date(2026, 1, 1)
    view = View(UTC_ZONE, start, start + timedelta(days=days - 1))
    assert view.bucket == bucket


def test_weeks_are_local_days_seven_at_a_time_the_last_one_shorter() -> None:
    zone = ZoneInfo("America/New_York")
    view = View(zone, date(2026, 1, 1), date(2026, 4, 30))  # 120 days, across DST
    edges = view.edges()
    assert view.bucket == "week"
    assert edges[0] == datetime(2026, 1, 1, 5, tzinfo=UTC)  # local midnight, EST
    assert edges[-1] == datetime(2026, 5, 1, 4, tzinfo=UTC)  # the period's end, EDT
    local = [e.astimezone(zone) for e in edges[:-1]]
    assert all((b.date() - a.date()).days == 7 for a, b in pairwise(local))
    assert all(moment.hour == 0 for moment in local)
    assert len(edges) == 19  # 17 whole weeks and a 1-day one: 18 buckets


def test_the_viewer_chooses_the_granularity() -> None:
    traffic = (datetime(2026, 7, 7, 9, tzinfo=UTC), datetime(2026, 7, 7, 15, tzinfo=UTC))
    view = View(UTC_ZONE, date(2026, 7, 1), date(2026, 7, 7), granularity="day", traffic=traffic)
    assert view.bucket == "day"
    assert view.edges() == [datetime(2026, 7, d, tzinfo=UTC) for d in range(1, 9)]
    with pytest.raises(ValueError, match="granularity"):
        View(UTC_ZONE, date(2026, 7, 1), date(2026, 7, 7), granularity="minute")
