"""Models and prices: the dated price book, what was actually paid, what went unpriced."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

import streamlit as st

from dashboard import charts, context, data, formatting, panels, tables
from dashboard.charts import Point
from dashboard.view import View
from pricing.book import Price

# The token classes drawn over time, each on its own chart and scale.
CLASSES = {
    "input": "Input",
    "cache_read": "Cache-read",
    "cache_write": "Cache-write",
    "output": "Output",
}


def rate_charts(prices: Sequence[Price], view: View) -> None:
    """One step chart per token class (cache writes only where an entry has a rate of its
    own), each model a series held from its entry until the next, the last to the end of
    the period at least."""
    until = max(view.upper, max(p.effective_from for p in prices))
    st.subheader("Rates over time")
    st.caption(
        "What each model's price book charged per million tokens, by token class: a step "
        "is a new dated entry. Each class has its own scale (not from 0), so a cut of a "
        "small rate shows as plainly as one of a large rate."
    )
    for kind, name in CLASSES.items():
        if kind == "cache_write" and all(p.cache_write is None for p in prices):
            continue  # written at the input rate: no rate of its own to draw
        points: list[Point] = []
        for model in sorted({p.model for p in prices}):
            entries = [p for p in prices if p.model == model]
            stops: list[tuple[datetime, Price]] = [(p.effective_from, p) for p in entries]
            stops.append((until, entries[-1]))
            points += [
                Point(
                    formatting.wall_clock(at, view.zone),
                    model,
                    float(rate),
                    formatting.money(rate, p.currency),
                )
                for at, p in stops
                for rate in [getattr(p, kind) if getattr(p, kind) is not None else p.input]
            ]
        currencies = "/".join(sorted({p.currency for p in prices}))
        st.altair_chart(
            charts.rate_steps(
                points,
                title=f"{name} rate per 1M tokens",
                y_title=f"{currencies} per 1M {name.lower()} tokens",
                x_title=f"effective from ({view.zone.key})",
            ),
            width="stretch",
        )


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
    tables.table(
        [
            {
                "model": p.model,
                f"effective from ({view.zone.key})": formatting.moment(p.effective_from, view.zone),
                "input / 1M": formatting.money(p.input, p.currency),
                "cache read / 1M": formatting.money(p.cache_read, p.currency),
                "cache write / 1M": formatting.money(p.cache_write, p.currency)
                if p.cache_write is not None
                else None,
                "output / 1M": formatting.money(p.output, p.currency),
                "currency": p.currency,
                "source": p.source,
            }
            for p in models.prices
        ],
        key="price_book",
        missing={"cache write / 1M": "as input", "source": "not given"},
    )
    rate_charts(models.prices, view)

st.header("Blended input rate paid")
if not models.paid:
    context.has_traffic(ctx, in_view=False)
else:
    st.caption(
        "Input cost (uncached + cache read + cache write) per million prompt tokens, "
        "against the entry's list input rate: the gap is what the cache took off."
    )
    tables.table(
        [
            {
                "model": r.model,
                f"price entry from ({view.zone.key})": formatting.moment(
                    r.effective_from, view.zone
                ),
                "currency": r.currency,
                "list input / 1M": formatting.money(r.list_input_rate, r.currency),
                "paid input / 1M": formatting.money(r.paid_input_rate, r.currency)
                if r.paid_input_rate is not None
                else None,
                "attempts": r.sums.requests,
                "prompt tokens": r.sums.prompt_tokens,
                "token hit rate": None
                if not r.sums.prompt_tokens
                else formatting.percent(Decimal(r.sums.cache_read_tokens) / r.sums.prompt_tokens),
            }
            for r in models.paid
        ],
        key="paid_rates",
        missing={"paid input / 1M": "no prompt tokens", "token hit rate": "no prompt tokens"},
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
    panels.bar_chart(
        bars,
        title="Input rate per 1M tokens: list vs paid",
        y_title="per 1M tokens",
        y_format=",.3f",
    )

st.header("Unpriced requests")
if models.unpriced:
    st.warning(
        f"{sum(u.sums.requests for u in models.unpriced):,} attempts in this period had no "
        "price entry in force: their cost is unknown, and statements show them as unpriced "
        "lines without cost. Add a dated price with `kvgate prices add`.",
        icon=":material/warning:",
    )
    tables.table(
        [
            {
                "model": u.model,
                "attempts": u.sums.requests,
                "prompt tokens": u.sums.prompt_tokens,
                "output tokens": u.sums.output_tokens,
            }
            for u in models.unpriced
        ],
        key="unpriced",
    )
elif ctx.traffic is not None:
    st.success("Every request in this period was priced.")

st.header("By endpoint")
if models.endpoints:
    st.caption(
        "Attempts, tokens and cost per inference endpoint in this period (the same figures "
        "as the statements' endpoint column); 'before endpoints were kept' are records made "
        "before kvgate stored them (all chat or completions)."
    )
    tables.table(
        [
            {
                "endpoint": e.endpoint or "before endpoints were kept",
                "attempts": e.requests,
                "prompt tokens": e.prompt_tokens,
                "read from cache": e.cache_read_tokens,
                "output tokens": e.output_tokens,
                "cost": formatting.money(e.cost_total, e.currency)
                if e.currency is not None
                else "unpriced",
            }
            for e in models.endpoints
        ],
        key="endpoints",
    )
elif ctx.traffic is not None:
    st.caption("No attempts in this period.")

if ctx.only is None:  # operators only: it shows every tenant's figures
    st.header("Cost to serve")
    with ctx.sessions() as session:
        serving = data.serving(session, view)
    if not serving.configured:
        st.info(
            "No GPU costs yet: `kvgate gpu-cost set --deployment D --per-replica-hour AMOUNT "
            "--effective-from T` says what a vLLM deployment costs to run."
        )
    elif not serving.costs.lines and not serving.costs.idle:
        st.info("No hours of this period are under a GPU cost.")
    else:
        st.caption(
            "Each UTC hour's cost (per replica-hour × replicas) is split over the tenants by "
            "their work on the deployment that hour: uncached prompt tokens + R × output "
            "tokens (R: the entry's decode weight). Cache saving = hour cost × cache-read "
            "tokens / the hour's work: what prefilling the cached tokens would have cost. "
            "Margin = charged (the price book) - cost to serve. Hours without work are idle. "
            "USD."
        )
        rows = [
            {
                "deployment": line.deployment,
                "tenant": serving.names.get(line.tenant_id, line.tenant_id),
                "hours": line.hours,
                "cost to serve": formatting.money(line.cost_to_serve, "USD"),
                "charged": formatting.money(line.charged, "USD"),
                "margin": formatting.money(line.margin, "USD"),
                "cache saving": formatting.money(line.cache_saving, "USD"),
            }
            for line in sorted(
                serving.costs.lines,
                key=lambda line: (
                    line.deployment,
                    serving.names.get(line.tenant_id, line.tenant_id),
                ),
            )
        ]
        rows += [
            {
                "deployment": idle.deployment,
                "tenant": "(idle)",
                "hours": idle.hours,
                "cost to serve": formatting.money(idle.cost, "USD"),
                "charged": None,
                "margin": formatting.money(-idle.cost, "USD"),
                "cache saving": None,
            }
            for idle in serving.costs.idle
        ]
        rows.sort(key=lambda row: (str(row["deployment"]), row["tenant"] == "(idle)"))
        tables.table(
            rows,
            key="serving_cost",
            missing={"charged": "nothing (idle)", "cache saving": "nothing (idle)"},
        )
