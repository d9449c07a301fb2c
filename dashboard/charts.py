"""Altair charts. Inputs are plain points; money becomes float only here, to be drawn.

Times arrive as local wall-clock strings (``formatting.wall_clock``) on a UTC scale, so
the browser draws them in the zone the viewer chose rather than its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import altair as alt

# Streamlit fits a whole chart (title, axes, legend and plot) into its ``height``: a chart
# is given its plot area (at least 240 px: the browser test checks) plus room for the rest.
PLOT = 250
FRAME = 175  # title, x axis labels and title, the legend's padding (measured in Chromium)
LEGEND_ROW = 24  # a legend row (two series to a row)


def height(points: Sequence[Point]) -> int:
    """The chart's whole height: its plot area and the frame around it."""
    series = len({p.series for p in points})
    return PLOT + FRAME + LEGEND_ROW * -(-series // 2)


# Legends below the plot, full names wrapped onto rows, never cut.
LEGEND = alt.Legend(orient="bottom", columns=2, labelLimit=0, symbolLimit=0, title=None)
FORMATS = {"hour": "%b %d %H:%M", "day": "%b %d", "week": "%b %d"}


@dataclass(frozen=True, slots=True)
class Point:
    """One value of one series at one time (or category); ``text``: the value exactly as
    the hover shows it (money: ``formatting.money``), else the axis format rounds it."""

    at: str
    series: str
    value: float | None
    text: str | None = None


def _data(points: Sequence[Point]) -> dict[str, Any]:
    return {
        "values": [
            {"at": p.at, "series": p.series, "value": p.value, "text": p.text} for p in points
        ]
    }


def value_tooltip(points: Sequence[Point], y_format: str) -> alt.Tooltip:
    """The hover's value: the exact text where the points carry one (a float drawn at six
    places would show a small amount as 0), else the value in the axis format."""
    if any(p.text is not None for p in points):
        return alt.Tooltip("text:N", title="value")
    return alt.Tooltip("value:Q", format=y_format)


def _moment_tooltip(title: str) -> alt.Tooltip:
    """The hover's time of a point, to the minute, on the chart's UTC scale."""
    return alt.Tooltip(
        "at:T", title=title, format="%Y-%m-%d %H:%M", timeUnit="utcyearmonthdatehoursminutes"
    )


MAX_TICKS = 12


def ticks(points: Sequence[Point]) -> list[dict[str, Any]]:
    """Tick positions (Vega-Lite DateTimes, UTC): bucket starts, every k-th of them so that
    at most MAX_TICKS remain. Ticks only ever fall on bucket starts, so no label repeats (a
    daily chart never shows two ticks of the same day)."""
    starts = sorted({p.at for p in points})
    step = max(1, -(-len(starts) // MAX_TICKS))
    moments = [datetime.fromisoformat(at.replace("Z", "+00:00")) for at in starts[::step]]
    return [
        {
            "year": m.year,
            "month": m.month,
            "date": m.day,
            "hours": m.hour,
            "minutes": m.minute,
            "utc": True,
        }
        for m in moments
    ]


def _time_axis(bucket: str, title: str | None, points: Sequence[Point]) -> alt.X:
    """Time on x, ticked at bucket starts (``ticks``)."""
    return alt.X(
        "at:T",
        title=title,
        scale=alt.Scale(type="utc"),
        axis=alt.Axis(format=FORMATS[bucket], values=ticks(points), labelOverlap=True),
    )


def trend(
    points: Sequence[Point],
    *,
    title: str,
    y_title: str,
    y_format: str = ",.2f",
    bucket: str = "day",
    x_title: str | None = None,
    y_step: float | None = None,
) -> alt.Chart:
    """Lines over time, one per series; gaps stay gaps. ``y_step``: the least step between
    y ticks (1 for counts, so no tick falls between whole numbers)."""
    y_axis = (
        alt.Axis(format=y_format)
        if y_step is None
        else alt.Axis(format=y_format, tickMinStep=y_step)
    )
    chart: alt.Chart = (
        alt.Chart(_data(points), title=title, height=height(points))
        .mark_line(point=True)
        .encode(
            x=_time_axis(bucket, x_title, points),
            y=alt.Y("value:Q", title=y_title, axis=y_axis),
            color=alt.Color("series:N", legend=LEGEND),
            tooltip=[
                _moment_tooltip("time"),
                alt.Tooltip("series:N"),
                value_tooltip(points, y_format),
            ],
        )
    )
    return chart


def bars(points: Sequence[Point], *, title: str, y_title: str, y_format: str = ",.0f") -> alt.Chart:
    """Grouped bars: categories on x (``at``), one bar per series."""
    chart: alt.Chart = (
        alt.Chart(_data(points), title=title, height=height(points))
        .mark_bar()
        .encode(
            x=alt.X("at:N", title=None, axis=alt.Axis(labelAngle=-20, labelLimit=0)),
            xOffset="series:N",
            y=alt.Y("value:Q", title=y_title, axis=alt.Axis(format=y_format)),
            color=alt.Color("series:N", legend=LEGEND),
            tooltip=["at:N", "series:N", value_tooltip(points, y_format)],
        )
    )
    return chart


def fitted(values: Sequence[float]) -> list[float]:
    """A y domain fitted to the values, a tenth of their range (or of the value) beyond
    each end and never below 0, so a change of rate fills most of the plot's height."""
    low, high = min(values), max(values)
    pad = (high - low) / 10 if high > low else (abs(high) / 10 or 1.0)
    return [max(0.0, low - pad) if low >= 0 else low - pad, high + pad]


def rate_steps(points: Sequence[Point], *, title: str, y_title: str, x_title: str) -> alt.Chart:
    """Price-book rates over time: each series holds its rate until the next entry, on a
    y scale fitted to these rates alone (from 0, a cut of 0.02 to 0.015 beside a rate of
    0.60 would move the line by a pixel)."""
    values = [p.value for p in points if p.value is not None]
    chart: alt.Chart = (
        alt.Chart(_data(points), title=title, height=height(points))
        .mark_line(interpolate="step-after", point=True)
        .encode(
            x=alt.X(
                "at:T",
                title=x_title,
                scale=alt.Scale(type="utc"),
                axis=alt.Axis(format="%Y-%m-%d", labelOverlap=True),
            ),
            y=alt.Y(
                "value:Q",
                title=y_title,
                scale=alt.Scale(zero=False, domain=fitted(values or [0.0])),
                axis=alt.Axis(format=",.4~f"),
            ),
            color=alt.Color("series:N", legend=LEGEND),
            tooltip=[
                _moment_tooltip("effective from"),
                alt.Tooltip("series:N", title="model"),
                value_tooltip(points, ",.6f"),
            ],
        )
    )
    return chart
