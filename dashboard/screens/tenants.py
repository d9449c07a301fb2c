"""Tenants: the overview's figures per tenant, and one tenant's trends and statement."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial

import streamlit as st

from dashboard import budgets, context, data, formatting, panels, tables
from gateway import billing
from gateway.errors import InvalidRequest

# What the tenants table shows, as many as fit at 1500 px; the rest is under "All columns".
TENANT_COLUMNS = (
    "tenant",
    "spend",
    "completed interactions",
    "cost per completed interaction",
    "token hit rate",
    "routing efficiency",
    "saved by cache",
)

# What an empty cell means, column by column (else "–").
MISSING = {
    "token hit rate": "no prompt tokens",
    "routing efficiency": panels.NO_ROUTING,
    "ceiling": panels.NO_ROUTING,
    "lost to avoidable misses": panels.NO_ROUTING,
    "failed or retried share": "no spend",
}

ctx = context.current()
view = ctx.view
st.title("Tenants" if ctx.only is None else "Your figures")
with ctx.sessions() as session:
    everyone = data.tenants(session, view, ctx.only)

if context.has_traffic(ctx, in_view=bool(everyone.figures)):
    rows = []
    for tenant_id, f in sorted(
        everyone.figures.items(), key=lambda item: (-item[1].sums.cost_total, item[0])
    ):
        cur = f.currency
        rows.append(
            {
                "tenant": everyone.names.get(tenant_id, tenant_id),
                # Nothing priced: the spend is unknown, not 0.
                "spend": formatting.MISSING
                if cur is None
                else formatting.money(f.sums.cost_total, cur),
                "completed interactions": f.completed_interactions,
                "cost per completed interaction": formatting.money(
                    f.cost_per_completed_interaction, cur
                ),
                "unpriced interactions": tables.share(f.unpriced_interaction_share),
                "attempts": f.sums.requests,
                "unpriced attempts": f.unpriced.requests,
                "failed or retried share": tables.share(f.failed_cost_share),
                "token hit rate": tables.share(f.hit_rate),
                "routing efficiency": tables.share(f.routing_efficiency),
                "ceiling": f.ceiling_kind if f.ceiling_requests else None,
                "saved by cache": formatting.money(f.saved, cur),
                "lost to avoidable misses": formatting.money(f.avoidable_miss_cost, cur)
                if f.ceiling_requests
                else None,
            }
        )
    tables.wide(
        rows,
        TENANT_COLUMNS,
        key="tenant_table",
        missing=MISSING,
    )

st.header("Budgets")
with ctx.sessions() as session:
    spending = data.budgets_of(session, view, tenant_ids=ctx.tenant_ids, at=datetime.now(UTC))
budgets.table(spending, everyone.names, view.zone)
if ctx.traffic is not None:
    budgets.refusals(spending, view)

st.header("A tenant")
if not everyone.names:
    st.info(
        "No tenants yet: `kvgate tenants create NAME`, then `kvgate keys create --tenant NAME`."
    )
else:
    tenant_id = st.selectbox(
        "Tenant", list(everyone.names), key="tenant", format_func=everyone.names.__getitem__
    )
    name = everyone.names[tenant_id]
    st.subheader("Billing statement")
    try:
        billing.check_period(view.start, view.end)
    except InvalidRequest as exc:
        st.error(f"No statement for this period: {exc.message}")
    else:
        st.caption(
            f"UTC days {view.start} to {view.end} (statements are cut on UTC days): "
            "the same bytes as `GET /v1/billing/statement`, made when you click."
        )
        left, right, _ = st.columns([1, 1, 4])
        stem = f"kvgate-{name}-{view.start}-{view.end}"
        for column, fmt, mime in ((left, "csv", "text/csv"), (right, "json", "application/json")):
            column.download_button(
                f"Download {fmt.upper()}",
                partial(
                    data.statement,
                    ctx.sessions,
                    tenant_id=tenant_id,
                    start=view.start,
                    end=view.end,
                    fmt=fmt,
                ),
                file_name=f"{stem}.{fmt}",
                mime=mime,
                key=f"statement_{fmt}",
                icon=":material/download:",
                on_click="ignore",
            )
    st.subheader(f"{name}: figures")
    with ctx.sessions() as session:
        mine = data.overview(session, view.for_tenant(tenant_id))
    if mine.totals.sums.requests:
        panels.metrics(mine, view.for_tenant(tenant_id))
        panels.trends(mine, view.for_tenant(tenant_id))
        if note := panels.adjusted_note(mine):
            st.caption(f":material/edit_note: {note}")
        with ctx.sessions() as session:
            spenders = data.attribution_of(session, view.for_tenant(tenant_id))
        panels.spenders(spenders, mine.totals.currency)
    else:
        st.info(f"No requests from {name} in this period.")
