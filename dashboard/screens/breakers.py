"""Cache economics: where prompts break their cache reuse, and whether kvgate's counts agree
with the replicas' own.

Prefix breakers rank each tenant and model's break positions (gateway.db.figures.breaks);
"lost to prefix breaks" sits beside "saved by the cache" and "lost to avoidable misses".
Reconciliation shows each replica's windows against its counters
(gateway.db.figures.reconcile); more than 1 % apart is flagged.
"""

from __future__ import annotations

from decimal import Decimal

import streamlit as st

from dashboard import context, formatting, tables
from gateway.db.figures import breaks, reconcile, spend
from gateway.db.lookups import tenant_names

ctx = context.current()
view = ctx.view
st.title("Cache economics")
with ctx.sessions() as session:
    totals = spend.totals(session, view.scope)
    found = breaks.positions(session, view.scope)
    names = tenant_names(session, ctx.only)
    # Replica counters hold every tenant's traffic together: the operator's alone.
    windows = (
        reconcile.reconcile(session, since=view.lower, until=view.upper)
        if ctx.only is None
        else None
    )
found.sort(key=lambda p: (names.get(p.tenant_id, p.tenant_id), p.model, -p.lost_tokens))

if context.has_traffic(ctx, in_view=totals.sums.requests > 0):
    currency = totals.currency or "USD"
    lost = sum((p.lost_usd for p in found), Decimal(0))
    row = st.columns(3)
    row[0].metric("Saved by the cache", formatting.money(totals.saved, currency))
    row[1].metric(
        "Lost to avoidable misses", formatting.money(totals.avoidable_miss_cost, currency)
    )
    row[2].metric(
        "Lost to prefix breaks",
        formatting.money(lost, currency),
        f"{formatting.count(sum(p.requests for p in found))} requests broke",
        delta_color="off",
    )
    st.subheader("Prefix breakers")
    if not found:
        st.caption("No prefix breaks: every request of an interaction extended the one before it.")
    else:
        st.caption(
            "Where a request's prompt first left its interaction's previous request, per "
            "tenant and model, most tokens lost first. Early: in the first 10 % of the prompt "
            "or its first two blocks: put the stable text first."
        )
        tables.table(
            [
                {
                    "tenant": names.get(p.tenant_id, p.tenant_id),
                    "model": p.model,
                    "break at token": p.break_tokens,
                    "early": p.early,
                    "requests": p.requests,
                    "tokens lost": p.lost_tokens,
                    "lost": formatting.money(p.lost_usd, p.currency),
                    "what changed": (
                        f"…{p.context['before']}⟨{p.context['previous']} → {p.context['current']}⟩"
                        if p.context
                        else ""
                    ),
                }
                for p in found
            ],
            key="breakers",
        )
    if windows is not None:  # the operator
        st.subheader("Reconciliation with the replicas")
        if not windows:
            st.caption("No replica samples in this period: the gateway stores them as it runs.")
        else:
            st.caption(
                "kvgate's records of the attempts on each replica against the replica's own "
                "counters (vllm:prompt_tokens, vllm:prefix_cache_hits), per hour."
            )
            tables.table(
                [
                    {
                        "replica": w.upstream,
                        "from": formatting.moment(w.sampled_from, view.zone),
                        "to": formatting.moment(w.sampled_to, view.zone),
                        "requests": w.recorded.requests,
                        "prompt recorded": w.recorded.prompt_tokens,
                        "prompt counted": w.engine.prompt_tokens,
                        "prompt drift": formatting.percent(w.prompt_drift),
                        "cached recorded": w.recorded.cache_read_tokens,
                        "cached counted": w.engine.prefix_cache_hits,
                        "cached drift": formatting.percent(w.cached_drift),
                        "apart": ", ".join(w.over()) + (" (restarted)" if w.restarted else ""),
                    }
                    for w in windows
                ],
                key="reconcile",
                missing={"apart": "within 1 %"},
            )
            apart = [w for w in windows if w.over()]
            if apart:
                st.warning(
                    f"{len(apart)} replica-window(s) more than 1 % apart: requests the gateway "
                    "did not see, usage it estimated, or a replica that restarted.",
                    icon=":material/warning:",
                )
