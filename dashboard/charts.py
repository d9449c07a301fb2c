"""Altair charts. Inputs are plain points; money becomes float only here, to be drawn.

Times arrive as local wall-clock strings (``formatting.wall_clock``) on a UTC scale, so
the browser draws them in the zone the viewer chose rather than its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import altair as alt

HEIGHT = 220


@dataclass(frozen=True, slots=True)
class Point:
    """One value of one series at one time (or category)."""

    at: str
    series: str
    value: float | None


def _data(points: Sequence[Point]) -> dict[str, Any]:
    return {"values": [{"at": p.at, "series": p.series, "value": p.value} for p in points]}


def _time_axis(hourly: bool) -> alt.X:
    return alt.X(
        "at:T",
        title=None,
        scale=alt.Scale(type="utc"),
        axis=alt.Axis(format="%b %d %H:%M" if hourly else "%b %d", labelOverlap=True),
    )


def trend(
    points: Sequence[Point],
    *,
    title: str,
    y_title: str,
    y_format: str = ",.2f",
    hourly: bool = False,
) -> alt.Chart:
    """Lines over time, one per series; gaps stay gaps."""
    chart: alt.Chart = (
        alt.Chart(_data(points), title=title, height=HEIGHT)
        .mark_line(point=True)
        .encode(
            x=_time_axis(hourly),
            y=alt.Y("value:Q", title=y_title, axis=alt.Axis(format=y_format)),
            color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom")),
            tooltip=[
                alt.Tooltip(
                    "at:T",
                    title="time",
                    format="%Y-%m-%d %H:%M",
                    timeUnit="utcyearmonthdatehoursminutes",
                ),
                alt.Tooltip("series:N"),
                alt.Tooltip("value:Q", format=y_format),
            ],
        )
    )
    return chart


def bars(points: Sequence[Point], *, title: str, y_title: str, y_format: str = ",.0f") -> alt.Chart:
    """Grouped bars: categories on x (``at``), one bar per series."""
    chart: alt.Chart = (
        alt.Chart(_data(points), title=title, height=HEIGHT)
        .mark_bar()
        .encode(
            x=alt.X("at:N", title=None, axis=alt.Axis(labelAngle=-20, labelLimit=220)),
            xOffset="series:N",
            y=alt.Y("value:Q", title=y_title, axis=alt.Axis(format=y_format)),
            color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom")),
            tooltip=["at:N", "series:N", alt.Tooltip("value:Q", format=y_format)],
        )
    )
    return chart


def rate_steps(points: Sequence[Point], *, title: str) -> alt.Chart:
    """Price-book rates over time: each series holds its rate until the next entry."""
    chart: alt.Chart = (
        alt.Chart(_data(points), title=title, height=HEIGHT)
        .mark_line(interpolate="step-after", point=True)
        .encode(
            x=alt.X(
                "at:T",
                title="effective from",
                scale=alt.Scale(type="utc"),
                axis=alt.Axis(format="%Y-%m-%d"),
            ),
            y=alt.Y("value:Q", title="per 1M tokens", axis=alt.Axis(format=",.3f")),
            color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom", columns=2)),
            tooltip=[
                alt.Tooltip(
                    "at:T", format="%Y-%m-%d %H:%M", timeUnit="utcyearmonthdatehoursminutes"
                ),
                "series:N",
                alt.Tooltip("value:Q", format=",.6f"),
            ],
        )
    )
    return chart
