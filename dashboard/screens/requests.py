"""Requests: the latest attempts with their cost, and every attempt of one interaction."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import context, data, formatting, tables
from gateway.db import lookups
from gateway.db.lookups import RequestLine
from pricing.cost import ZERO

STATUSES = ("completed", "failed", "cancelled")
COSTS = (
    ("cost uncached", "cost_uncached"),
    ("cost cache read", "cost_cache_read"),
    ("cost cache write", "cost_cache_write"),
    ("cost output", "cost_output"),
    ("cost total", "cost_total"),
)
LIMIT = 100
# What the tables show after the start; the rest is under "All columns".
KEY_COLUMNS = (
    "request id",
    "interaction id",
    "attempt",
    "tenant",
    "model",
    "status",
    "ttft ms",
    "cost total",
)

# What an empty cell means, column by column (else "–").
MISSING = {
    "replica": "no replica",
    "ttft ms": "no first token",
    "currency": "unpriced",
    "price": "unpriced",
    "error": "none",
    **{label: "unpriced" for label, _ in COSTS},
}

ctx = context.current()
view = ctx.view


def table(lines: list[RequestLine], names: dict[str, str], key: str) -> Any:
    """Attempts as rows, times in the viewer's zone, each cost class exact; the key
    columns shown, every one under "All columns"."""
    zone = view.zone
    started = f"started ({zone.key})"
    return tables.wide(
        [
            {
                started: formatting.moment(line.started_at, zone),
                "request id": line.request_id,
                "interaction id": line.interaction_id,
                "attempt": line.attempt,
                "tenant": names.get(line.tenant_id, line.tenant_id),
                "model": line.model,
                "replica": line.upstream,
                "status": line.status,
                "ttft ms": None
                if line.first_token_at is None
                else round((line.first_token_at - line.started_at).total_seconds() * 1000, 1),
                "usage": line.usage_source,
                "uncached": line.sums.uncached_tokens,
                "cache read": line.sums.cache_read_tokens,
                "cache write": line.sums.cache_write_tokens,
                "output": line.sums.output_tokens,
                "currency": line.currency or "",
                # An unpriced attempt's cost is unknown: empty cells, not 0.
                **{
                    label: formatting.money(getattr(line.sums, name), line.currency)
                    if line.priced
                    else None
                    for label, name in COSTS
                },
                "price": line.price_id or "unpriced",
                "error": line.error,
            }
            for line in lines
        ],
        (started, *KEY_COLUMNS),
        key=key,
        missing=MISSING,
        on_select="rerun",
        selection_mode="single-row",
    )


st.title("Requests")
with ctx.sessions() as session:
    names = lookups.tenant_names(session, ctx.only)
    models = lookups.models(session, ctx.only)

wanted = st.text_input(
    "Look up a request id or an interaction id",
    key="lookup",
    placeholder="req_… or an interaction id",
).strip()
found_box = st.container()  # filled last: a row picked below also fills it

st.header("Latest attempts")
left, middle, right = st.columns(3)
tenant_id = (
    left.selectbox(
        "Tenant",
        [None, *names],
        key="req_tenant",
        format_func=lambda t: "all tenants" if t is None else names[t],
    )
    if ctx.only is None
    else ctx.only  # a tenant signed in: its own attempts alone
)
model = middle.selectbox(
    "Model",
    [None, *models],
    key="req_model",
    format_func=lambda m: "all models" if m is None else m,
)
status = right.selectbox(
    "Status",
    [None, *STATUSES],
    key="req_status",
    format_func=lambda s: "any status" if s is None else s,
)
with ctx.sessions() as session:
    recent = data.requests(
        session, view, tenant_id=tenant_id, model=model, status=status, limit=LIMIT
    )
if context.has_traffic(ctx, in_view=bool(recent) or ctx.traffic is None):
    if not recent:
        st.info("No attempts match these filters in this period.")
    else:
        st.caption(
            f"The {len(recent)} latest in the period, newest first; select a row to "
            "see every attempt of its interaction."
        )
        picked = table(recent, names, "recent").selection.rows
        if picked and not wanted:
            wanted = recent[picked[0]].request_id

if wanted:
    with ctx.sessions() as session:
        found = lookups.attempts(session, request_or_interaction_id=wanted, only=ctx.only)
    with found_box:
        if not found:
            st.warning(f"No request or interaction {wanted!r}.")
        else:
            currencies = "/".join(sorted({line.currency for line in found if line.currency}))
            total = sum((line.sums.cost_total for line in found), ZERO)
            unpriced = sum(not line.priced for line in found)
            st.subheader(f"Interaction {found[0].interaction_id}")
            st.caption(
                f"{len(found)} attempts, "
                f"{sum(line.status == 'completed' for line in found)} completed: "
                f"{formatting.money(total, currencies or None)} in all"
                + (f", and {unpriced} unpriced (cost unknown)." if unpriced else ".")
            )
            table(found, names, "attempts")
