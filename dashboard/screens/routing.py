"""Routing: load and cache hits per replica, predictions against what replicas reported."""

from __future__ import annotations

from decimal import Decimal

import streamlit as st

from dashboard import context, data, formatting, panels, tables
from dashboard.charts import Point
from gateway.db.figures.replicas import Replica
from gateway.db.figures.spend import EXACT, ratio

NO_ROUTING = (
    "No routing data yet: requests carry predicted and ceiling cached tokens once "
    "KV-aware routing records them (`policy: kv-aware` in kvgate.yaml)."
)

# The replica table's columns that only KV-aware routing fills.
ROUTED = (
    "predicted cached tokens",
    "reported cached tokens (predicted requests)",
    "ceiling hit rate",
    "routing efficiency",
    "ceiling",
)

# What the replica table shows; the rest is under "All columns".
REPLICA_COLUMNS = (
    "model",
    "replica",
    "attempts",
    "failed",
    "token hit rate",
    "ceiling hit rate",
    "routing efficiency",
    "ceiling",
)


def where(replica: Replica) -> str:
    """A replica's label on the charts: its model and upstream (one upstream may serve
    several models; an attempt refused or failed before sending has none)."""
    return f"{replica.model} on {replica.upstream or 'no replica'}"


ctx = context.current()
view = ctx.view
st.title("Routing")
with ctx.sessions() as session:
    routing = data.routing(session, view)

if context.has_traffic(ctx, in_view=bool(routing.replicas)):
    if view.tenant_ids:
        st.caption("Replica figures cover every tenant: the tenant filter does not apply here.")
    tables.wide(
        [
            {
                "model": r.model,
                "replica": r.upstream,
                "attempts": f.requests,
                "failed": f.failed_requests,
                "prompt tokens": f.prompt_tokens,
                "output tokens": f.output_tokens,
                "token hit rate": tables.share(f.hit_rate),
                "predicted cached tokens": f.predicted_cached_tokens
                if f.predicted_requests
                else None,
                "reported cached tokens (predicted requests)": f.predicted_cache_read_tokens
                if f.predicted_requests
                else None,
                "ceiling hit rate": tables.share(f.ceiling_rate),
                "routing efficiency": tables.share(f.routing_efficiency),
                "ceiling": f.ceiling_kind if f.ceiling_requests else None,
            }
            for r in routing.replicas
            for f in [r.figures]
        ],
        REPLICA_COLUMNS,
        key="replicas",
        missing={
            "replica": "no replica",
            "token hit rate": "no prompt tokens",
            **dict.fromkeys(ROUTED, panels.NO_ROUTING),
        },
    )
    approximate = sorted(
        {r.model for r in routing.replicas if r.figures.ceiling_kind not in (None, EXACT)}
    )
    if approximate:
        st.caption(
            f"Approximate ceilings and predictions for {', '.join(approximate)}: the router "
            "had no tokenizer for them (text mode) and counted blocks of characters, not "
            "tokens (or they were recorded before kvgate kept which). Set the deployment's "
            "`tokenizer` for exact figures."
        )
    left, right = st.columns(2)
    load = [
        Point(where(r), kind, float(value))
        for r in routing.replicas
        for kind, value in (("attempts", r.figures.requests), ("failed", r.figures.failed_requests))
    ]
    panels.bar_chart(load, title="Load per replica", y_title="attempts", column=left)
    hits = [
        Point(where(r), "token hit rate", float(r.figures.hit_rate))
        for r in routing.replicas
        if r.figures.hit_rate is not None
    ]
    panels.bar_chart(
        hits,
        title="Token hit rate per replica",
        y_title="share of prompt tokens read from cache",
        y_format=".0%",
        column=right,
    )

    st.header("Predicted vs reported cached tokens")
    predicted = [r for r in routing.replicas if r.figures.predicted_requests]
    if not predicted:
        st.info(NO_ROUTING, icon=":material/info:")
    else:
        points = [
            Point(where(r), kind, float(value))
            for r in predicted
            for kind, value in (
                ("predicted", r.figures.predicted_cached_tokens),
                ("reported", r.figures.predicted_cache_read_tokens),
            )
        ]
        panels.bar_chart(
            points,
            title="Cached tokens: predicted by the router vs reported by the replica",
            y_title="tokens",
        )
        accuracy = ratio(
            sum(r.figures.predicted_cache_read_tokens for r in predicted),
            sum(r.figures.predicted_cached_tokens for r in predicted),
        )
        st.caption(f"Reported / predicted: {formatting.percent(accuracy)}.")

    if routing.tiers:
        # Only replicas that say where their cached tokens came from (kvgate sim with
        # lower tiers; vLLM 0.32 does not, per request).
        st.header("Cached tokens by tier")
        tables.table(
            [
                {
                    "model": t.model,
                    "replica": t.upstream,
                    "requests": t.requests,
                    "GPU": tables.share(t.share(t.gpu_tokens)),
                    "host memory": tables.share(t.share(t.host_tokens)),
                    "disk": tables.share(t.share(t.disk_tokens)),
                    "cached tokens": t.cached_tokens,
                }
                for t in routing.tiers
            ],
            key="tiers",
            missing=dict.fromkeys(("GPU", "host memory", "disk"), "no cached tokens"),
        )

    st.header("Achieved vs ceiling over time")
    if not any(f.ceiling_requests for _, f in routing.trend):
        st.info(NO_ROUTING, icon=":material/info:")
    else:
        series: dict[str, list[tuple[str, Decimal | None]]] = {}
        for start, f in routing.trend:
            at = formatting.wall_clock(start, view.zone)
            series.setdefault("achieved", []).append((at, f.achieved_rate))
            series.setdefault("ceiling", []).append((at, f.ceiling_rate))
        points = [
            Point(at, name, None if v is None else float(v))
            for name, values in series.items()
            for at, v in values
        ]
        if any(f.ceiling_kind not in (None, EXACT) for _, f in routing.trend):
            st.caption("Part of this ceiling is approximate (see above).")
        panels.trend_chart(
            view,
            points,
            title="Token hit rate: achieved vs ceiling (requests with a ceiling)",
            y_title="share of prompt tokens read from cache",
            y_format=".0%",
        )
