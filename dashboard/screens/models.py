"""Models and prices: the dated price book, what was actually paid, what went unpriced."""

from __future__ import annotations

from datetime import datetime

import streamlit as st

from dashboard import charts, context, data, formatting
from dashboard.charts import Point
from pricing.book import Price

ctx = context.current()
view = ctx.view
st.title("Models and prices")
with ctx.sessions() as session:
    models = data.models(session, view)

st.header("Price book")
if not models.prices:
    st.info(
        "No prices yet: `kvgate prices sync` loads `pricing/catalog/*.yaml`; "
        "`kvgate prices add --model ... --effective-from ...` adds a dated entry."
    )
else:
    st.dataframe(
        [
            {
                "model": p.model,
                f"effective from ({view.zone.key})": formatting.moment(p.effective_from, view.zone),
                "input / 1M": formatting.money(p.input, p.currency),
                "cache read / 1M": formatting.money(p.cache_read, p.currency),
                "cache write / 1M": formatting.money(p.cache_write, p.currency),
                "output / 1M": formatting.money(p.output, p.currency),
                "currency": p.currency,
                "source": p.source,
            }
            for p in models.prices
        ],
        hide_index=True,
        key="price_book",
    )
    # Each model's last entry holds until now: draw it to the end of the period at least.
    until = max(view.upper, max(p.effective_from for p in models.prices))
    points: list[Point] = []
    for model in sorted({p.model for p in models.prices}):
        entries = [p for p in models.prices if p.model == model]
        for kind in ("input", "cache_read", "output"):
            series = f"{model} {kind.replace('_', ' ')}"
            stops: list[tuple[datetime, Price]] = [(p.effective_from, p) for p in entries]
            stops.append((until, entries[-1]))
            points += [
                Point(
                    formatting.wall_clock(at, view.zone),
                    series,
                    float(getattr(p, kind)),
                    formatting.money(getattr(p, kind), p.currency),
                )
                for at, p in stops
            ]
    st.altair_chart(
        charts.rate_steps(points, title="Rates over time (per 1M tokens)"), width="stretch"
    )

st.header("Blended input rate paid")
if not models.paid:
    context.has_traffic(ctx, in_view=False)
else:
    st.caption(
        "Input cost (uncached + cache read + cache write) per million prompt tokens, "
        "against the entry's list input rate: the gap is what the cache took off."
    )
    st.dataframe(
        [
            {
                "model": r.model,
                f"price entry from ({view.zone.key})": formatting.moment(
                    r.effective_from, view.zone
                ),
                "currency": r.currency,
                "list input / 1M": formatting.money(r.list_input_rate, r.currency),
                "paid input / 1M": formatting.money(r.paid_input_rate, r.currency),
                "attempts": r.sums.requests,
                "prompt tokens": r.sums.prompt_tokens,
                "token hit rate": None
                if not r.sums.prompt_tokens
                else r.sums.cache_read_tokens / r.sums.prompt_tokens,
            }
            for r in models.paid
        ],
        hide_index=True,
        key="paid_rates",
        column_config={
            "token hit rate": st.column_config.NumberColumn(format="percent"),
        },
    )
    bars = []
    for r in models.paid:
        label = f"{r.model} from {formatting.moment(r.effective_from, view.zone)[:10]}"
        bars.append(
            Point(
                label,
                "list input rate",
                float(r.list_input_rate),
                formatting.money(r.list_input_rate, r.currency),
            )
        )
        if r.paid_input_rate is not None:
            bars.append(
                Point(
                    label,
                    "blended input rate paid",
                    float(r.paid_input_rate),
                    formatting.money(r.paid_input_rate, r.currency),
                )
            )
    st.altair_chart(
        charts.bars(
            bars,
            title="Input rate per 1M tokens: list vs paid",
            y_title="per 1M tokens",
            y_format=",.3f",
        ),
        width="stretch",
    )

st.header("Unpriced requests")
if models.unpriced:
    st.warning(
        f"{sum(u.sums.requests for u in models.unpriced):,} attempts in this period had no "
        "price entry in force: their cost is unknown, and statements show them as unpriced "
        "lines without cost. Add a dated price with `kvgate prices add`.",
        icon=":material/warning:",
    )
    st.dataframe(
        [
            {
                "model": u.model,
                "attempts": u.sums.requests,
                "prompt tokens": u.sums.prompt_tokens,
                "output tokens": u.sums.output_tokens,
            }
            for u in models.unpriced
        ],
        hide_index=True,
        key="unpriced",
    )
elif ctx.traffic is not None:
    st.success("Every request in this period was priced.")
