"""The figures block shared by the overview and a tenant's page: metrics, then trends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Literal

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from dashboard import charts, formatting, tables
from dashboard.changes import Before, Better, Change
from dashboard.charts import Point
from dashboard.data import Attribution, Overview
from dashboard.view import View
from gateway.db.figures.spend import EXACT, Figures

NO_ROUTING = "no routing data yet"


def approximate_ceiling(figures: Figures) -> str:
    """Why the ceiling of these figures is not exact, in a sentence."""
    share = figures.ceiling_requests - figures.exact_ceiling_requests
    return (
        f"The ceiling is approximate for {formatting.count(share)} of "
        f"{formatting.count(figures.ceiling_requests)} requests: the router had no tokenizer "
        "for their model (text mode) and counted blocks of characters, not tokens (or they "
        "were recorded before kvgate kept which). Set the deployment's `tokenizer` for exact "
        "figures."
    )


def _series(
    trend: list[tuple[datetime, Figures]], value: Callable[[Figures], Decimal | int | None]
) -> list[float] | None:
    """A sparkline: the buckets that have a value (a ratio of nothing has none)."""
    values = [float(v) for _, f in trend if (v := value(f)) is not None]
    return values if len(values) > 1 else None


def _points(
    view: View,
    trend: list[tuple[datetime, Figures]],
    series: dict[str, Callable[[Figures], Decimal | int | None]],
    currency: str | None = None,
    *,
    money: bool = False,
) -> list[Point]:
    """Chart points of each series; money ones carry their exact text for the hover."""
    return [
        Point(
            formatting.wall_clock(start, view.zone),
            name,
            None if (v := value(figures)) is None else float(v),
            formatting.money(Decimal(v), currency) if money and v is not None else None,
        )
        for name, value in series.items()
        for start, figures in trend
    ]


def adjusted_note(data: Overview) -> str | None:
    """Which days of the period price corrections adjusted (None: none did)."""
    if not data.adjusted:
        return None
    currency = data.totals.currency
    days = ", ".join(
        f"{day} ({'+' if delta >= 0 else '-'}{formatting.money(abs(delta), currency)})"
        for day, delta in data.adjusted
    )
    return (
        f"Price corrections adjusted {days} (UTC days). The figures and charts show the "
        "costs as recorded; statements show the adjustments as lines of their own."
    )


def unpriced_note(totals: Figures) -> str | None:
    """Beside spend: the attempts it leaves out because no price entry covered them."""
    n = totals.unpriced.requests
    if not n:
        return None
    return f"+ {formatting.count(n)} unpriced attempt{'s' if n != 1 else ''}, cost unknown"


def unpriced_share_note(totals: Figures) -> str | None:
    """Beside cost per completed interaction: the share of interactions it leaves out."""
    if not totals.unpriced_completed_interactions:
        return None
    return f"{formatting.percent(totals.unpriced_interaction_share)} of interactions unpriced"


def _tile(
    column: DeltaGenerator,
    label: str,
    value: str,
    change: Change,
    before: Before,
    *,
    help: str,
    note: str | None = None,
    chart: list[float] | None = None,
    chart_type: Literal["line", "bar"] = "line",
) -> None:
    """One tile: its value, the change since the previous period, and a note under it."""
    column.metric(
        label,
        value,
        change.delta,
        delta_color=change.color,
        delta_arrow=change.arrow,
        delta_description=before.description if change.delta is not None else None,
        chart_data=chart,
        chart_type=chart_type,
        border=True,
        help=f"{help}\n\n{change.previous}",
    )
    if note:
        column.caption(note)


def _share_tile(
    column: DeltaGenerator,
    label: str,
    share: Callable[[Figures], Decimal | None],
    data: Overview,
    before: Before,
    *,
    better: Better,
    help: str,
) -> None:
    """A tile of a share of the period's figures: its value, its change, its trend."""
    now = share(data.totals)
    _tile(
        column,
        label,
        formatting.percent(now),
        before.share(now, share(data.previous), better=better),
        before,
        chart=_series(data.trend, share),
        help=help,
    )


def _money_tile(
    column: DeltaGenerator,
    label: str,
    amount: Callable[[Figures], Decimal | None],
    data: Overview,
    before: Before,
    *,
    better: Better,
    help: str,
    note: str | None = None,
) -> None:
    """A tile of an amount of the period's figures in its currency: value, change, trend."""
    now, cur = amount(data.totals), data.totals.currency
    _tile(
        column,
        label,
        formatting.money(now, cur),
        before.money(now, amount(data.previous), cur, data.previous.currency, better=better),
        before,
        note=note,
        chart=_series(data.trend, amount),
        help=help,
    )


def ceiling_note(totals: Figures) -> str | None:
    """Under the ceiling and efficiency tiles: that the ceiling is approximate, if it is."""
    routed = totals.ceiling_requests > 0
    return f"{totals.ceiling_kind} ceiling" if routed and totals.ceiling_kind != EXACT else None


def _ceiling_tile(
    column: DeltaGenerator,
    label: str,
    rate: Callable[[Figures], Decimal | None],
    data: Overview,
    before: Before,
    *,
    better: Better,
    help: str,
) -> None:
    """A tile of a rate over the requests that carry a ceiling: "no routing data yet" until
    some do, and a note and a sentence more of help where the ceiling is approximate."""
    totals = data.totals
    routed = totals.ceiling_requests > 0
    approximate = routed and totals.ceiling_kind != EXACT
    _tile(
        column,
        label,
        formatting.percent(rate(totals)) if routed else NO_ROUTING,
        before.share(rate(totals), rate(data.previous), better=better),
        before,
        note=ceiling_note(totals),
        chart=_series(data.trend, rate) if routed else None,
        help=(help + (f" {approximate_ceiling(totals)}" if approximate else ""))
        if routed
        else "Requests carry a hit-rate ceiling once KV-aware routing records it.",
    )


def metrics(data: Overview, view: View) -> None:
    """The headline figures, each with a sparkline of its trend and its change since the
    previous period (``View.previous``) of as many days."""
    totals, trend, cur = data.totals, data.trend, data.totals.currency
    prev, prev_cur = data.previous, data.previous.currency
    before = Before(view.previous(), prev.sums.requests > 0)
    row = st.columns(4)
    _tile(
        row[0],
        "Spend",
        # Nothing priced: the spend is unknown, not 0 in an assumed currency.
        formatting.MISSING if cur is None else formatting.money(totals.sums.cost_total, cur),
        before.money(totals.sums.cost_total, prev.sums.cost_total, cur, prev_cur, better="neither"),
        before,
        note=unpriced_note(totals),
        chart=_series(trend, lambda f: f.sums.cost_total),
        help="Cost of the priced attempts in the period, failed and retried ones included; "
        "attempts no price entry covered have no cost to add.",
    )
    _tile(
        row[1],
        "Completed interactions",
        formatting.count(totals.completed_interactions),
        before.count(totals.completed_interactions, prev.completed_interactions, better="higher"),
        before,
        chart=_series(trend, lambda f: f.completed_interactions),
        chart_type="bar",
        help="Interactions (requests sharing an interaction id) with a completed "
        "attempt in the period.",
    )
    _money_tile(
        row[2],
        "Cost per completed interaction",
        lambda f: f.cost_per_completed_interaction,
        data,
        before,
        better="lower",
        note=unpriced_share_note(totals),
        help="Cost of priced attempts (failed and retried ones included) / completed "
        "interactions a priced attempt completed: "
        f"{formatting.count(totals.priced_completed_interactions)} of "
        f"{formatting.count(totals.completed_interactions)}. Interactions no price entry "
        "covered are left out, not counted at 0.",
    )
    _share_tile(
        row[3],
        "Token hit rate",
        lambda f: f.hit_rate,
        data,
        before,
        better="higher",
        help="Cached prompt tokens / prompt tokens.",
    )
    routed = totals.ceiling_requests > 0
    row = st.columns(4)
    _ceiling_tile(
        row[0],
        "Hit-rate ceiling",
        lambda f: f.ceiling_rate,
        data,
        before,
        better="neither",
        help="The token hit rate an infinite, perfectly routed cache would have reached on "
        f"the {formatting.count(totals.ceiling_requests)} requests that carry a ceiling: "
        "the number routing efficiency is measured against.",
    )
    _ceiling_tile(
        row[1],
        "Routing efficiency",
        lambda f: f.routing_efficiency,
        data,
        before,
        better="higher",
        help="Achieved / ceiling cached tokens; ceiling hit rate "
        f"{formatting.percent(totals.ceiling_rate)}.",
    )
    _money_tile(
        row[2],
        "Saved by the cache",
        lambda f: f.saved,
        data,
        before,
        better="higher",
        help="What the same tokens would have cost uncached, minus what they cost.",
    )
    _tile(
        row[3],
        "Lost to avoidable misses",
        formatting.money(totals.avoidable_miss_cost, cur) if routed else NO_ROUTING,
        before.money(
            totals.avoidable_miss_cost if routed else None,
            prev.avoidable_miss_cost if prev.ceiling_requests else None,
            cur,
            prev_cur,
            better="lower",
        ),
        before,
        chart=_series(trend, lambda f: f.avoidable_miss_cost) if routed else None,
        help="Misses the ceiling says perfect routing would have hit, priced at "
        "input minus cache-read rate.",
    )
    ttft, prev_ttft = data.ttft, data.previous_ttft
    last = st.columns(4)
    _share_tile(
        last[0],
        "Failure rate",
        lambda f: f.failure_rate,
        data,
        before,
        better="lower",
        help="Attempts that did not complete (failed, or cancelled by the client) / "
        f"attempts: {formatting.count(totals.failed.requests)} of "
        f"{formatting.count(totals.admitted)}. Requests refused at admission by a budget "
        "or a rate limit are the client's own limits, not failures: they count on neither "
        f"side ({formatting.count(totals.refused.requests)} in the period).",
    )
    _tile(
        last[1],
        "Spend on failed or retried attempts",
        formatting.money(totals.failed.cost_total, cur) if cur is not None else formatting.MISSING,
        before.money(
            totals.failed.cost_total, prev.failed.cost_total, cur, prev_cur, better="lower"
        ),
        before,
        note=(
            f"{formatting.percent(totals.failed_cost_share)} of spend"
            if totals.failed_cost_share is not None
            else None
        ),
        chart=_series(trend, lambda f: f.failed.cost_total),
        help="What the attempts that did not complete cost (their tokens were paid for).",
    )
    for column, kind, p50, p90, count, was in (
        (
            last[2],
            "cold",
            ttft.cold_p50_ms,
            ttft.cold_p90_ms,
            ttft.cold_requests,
            prev_ttft.cold_p50_ms,
        ),
        (
            last[3],
            "warm",
            ttft.warm_p50_ms,
            ttft.warm_p90_ms,
            ttft.warm_requests,
            prev_ttft.warm_p50_ms,
        ),
    ):
        _tile(
            column,
            f"TTFT {kind} p50",
            formatting.millis(p50),
            before.millis(p50, was),
            before,
            note=f"p90 {formatting.millis(p90)}",
            help=f"Time to first token of requests with {'no' if kind == 'cold' else 'some'} "
            f"cached tokens: {formatting.count(count)} of them. Percentiles are the upper "
            "edges of histogram buckets (at most about 9 % high).",
        )


def trend_chart(
    view: View,
    points: Sequence[Point],
    *,
    title: str,
    y_title: str,
    y_format: str,
    column: DeltaGenerator | None = None,
) -> None:
    """A trend chart in ``column`` (else the page), bucketed as the view says, its time in
    the view's zone."""
    draw = st.altair_chart if column is None else column.altair_chart
    draw(
        charts.trend(
            points,
            title=title,
            y_title=y_title,
            y_format=y_format,
            bucket=view.bucket,
            x_title=f"{view.bucket} starting ({view.zone.key})",
        ),
        width="stretch",
    )


def bar_chart(
    points: Sequence[Point],
    *,
    title: str,
    y_title: str,
    y_format: str = ",.0f",
    column: DeltaGenerator | None = None,
) -> None:
    """A bar chart as wide as ``column`` (else the page)."""
    draw = st.altair_chart if column is None else column.altair_chart
    draw(charts.bars(points, title=title, y_title=y_title, y_format=y_format), width="stretch")


def _money_chart(
    view: View,
    data: Overview,
    series: dict[str, Callable[[Figures], Decimal | int | None]],
    *,
    title: str,
    column: DeltaGenerator,
) -> None:
    """A trend chart of amounts in the period's currency (named in the title, if any), each
    point's exact amount on hover."""
    cur = data.totals.currency
    trend_chart(
        view,
        _points(view, data.trend, series, cur, money=True),
        title=title if cur is None else f"{title} ({cur})",
        y_title=cur or "",
        y_format=",.6~f",  # ticks without trailing zeros: 0.14, not 0.140000
        column=column,
    )


def trends(data: Overview, view: View) -> None:
    """The trend charts under the metrics."""
    left, right = st.columns(2)
    _money_chart(
        view,
        data,
        {
            "spend": lambda f: f.sums.cost_total,
            "saved by cache": lambda f: f.saved,
            "lost to avoidable misses": lambda f: f.avoidable_miss_cost,
        },
        title=f"Spend and cache value per {view.bucket}",
        column=left,
    )
    left.caption(
        f"Where the money went each {view.bucket}: the spend, what the cache saved, and what "
        "perfect routing would have saved on top."
    )
    _money_chart(
        view,
        data,
        {"cost per completed interaction": lambda f: f.cost_per_completed_interaction},
        title="Cost per completed interaction",
        column=right,
    )
    right.caption(f"What one completed interaction cost, {view.bucket} by {view.bucket}.")
    left, right = st.columns(2)
    hit = {"token hit rate": lambda f: f.hit_rate}
    if data.totals.ceiling_requests:
        hit |= {
            "ceiling": lambda f: f.ceiling_rate,
            "achieved (requests with a ceiling)": lambda f: (
                None
                if not f.ceiling_prompt_tokens
                else Decimal(f.ceiling_cache_read_tokens) / f.ceiling_prompt_tokens
            ),
        }
    trend_chart(
        view,
        _points(view, data.trend, hit),
        title="Token hit rate against the ceiling",
        y_title="share of prompt tokens",
        y_format=".0%",
        column=left,
    )
    left.caption(
        "How much of the prompt came from cache, against the most any routing could reach."
    )
    if not data.totals.ceiling_requests:
        left.caption(f"Ceiling: {NO_ROUTING}.")
    elif data.totals.ceiling_kind != EXACT:
        left.caption(approximate_ceiling(data.totals))
    ttft_points = [
        Point(formatting.wall_clock(start, view.zone), name, value)
        for start, t in data.ttft_trend
        for name, value in (
            ("cold p50", t.cold_p50_ms),
            ("cold p90", t.cold_p90_ms),
            ("warm p50", t.warm_p50_ms),
            ("warm p90", t.warm_p90_ms),
        )
    ]
    trend_chart(
        view,
        ttft_points,
        title="Time to first token (ms)",
        y_title="ms",
        y_format=",.0f",
        column=right,
    )
    right.caption(
        "How long clients waited for the first token: cold (nothing cached) and warm; "
        "percentiles are bucket edges (at most about 9 % high)."
    )


def spenders(found: Attribution, currency: str | None) -> None:
    """One tenant's top end users and tags by spend, side by side."""
    left, right = st.columns(2)
    for column, title, rows, empty in (
        (
            left,
            "Top end users by spend",
            found.end_users,
            "No request named an end user: send OpenAI's `user` field.",
        ),
        (
            right,
            "Top tags by spend",
            found.tags,
            "No request carried tags: send `X-Kvgate-Tags: key=value` or `metadata`.",
        ),
    ):
        column.markdown(f"**{title}**")
        if not rows:
            column.caption(empty)
            continue
        tables.table(
            [
                {
                    "name": s.name,
                    "requests": s.requests,
                    "spend": formatting.money(s.cost_total, currency),
                }
                for s in rows
            ],
            key=f"spenders_{title}",
            into=column,
        )
    st.caption(
        "A request with several tags counts in full under each; statements split the same "
        "way with `group_by=end_user` or `group_by=tag:KEY`."
    )
