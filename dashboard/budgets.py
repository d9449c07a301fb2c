"""The Tenants page's budgets: a table of each budget's period, and refusals over time."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import streamlit as st

from dashboard import charts, formatting, tables
from dashboard.charts import Point
from dashboard.data import Budgets
from dashboard.view import View
from gateway.db.figures.budgets import BudgetFigures

NO_BUDGETS = (
    "No budgets yet: `kvgate budgets set --scope tenant:NAME --limit 100 --period month` "
    "(see the README's Spend control)."
)
CAPTION = (
    "Each budget in its current period as of {now} ({zone}). Spent is settled spend: what "
    "the period's records cost. Reserved is what requests in flight and the gateways' "
    "leases hold; remaining is the limit less what was spent. Burn rate: spend per day "
    "over the period so far (since the budget was set, if that is later). Runs out: when "
    "the remaining amount would be spent at that rate, shown only if that is before the "
    "period resets. An interaction budget caps each interaction on its own: it shows the "
    "largest interaction's spend and how many interactions it counted."
)
# What the budgets table shows; reserved, burn rate and the period's bounds are under
# "All columns".
COLUMNS = ("tenant", "scope", "period", "limit", "spent", "remaining", "runs out")
SERIES = {"budget": "budget (402)", "rate_limit": "rate limit (429)"}


def runs_out(f: BudgetFigures, zone: ZoneInfo) -> str:
    """When the budget runs out at its burn rate, or why it does not say."""
    if f.spent is None:
        return "per interaction"
    if f.exhausted:
        return "exhausted"
    if f.runs_out is not None:
        return formatting.minute(f.runs_out, zone)
    if f.burn_per_day is None:
        return formatting.MISSING  # the period has only just begun
    if not f.spent:
        return "no spend yet"
    return "not before it resets" if f.resets is not None else "not at this rate"


def rows(found: Budgets, names: dict[str, str], zone: ZoneInfo) -> list[dict[str, str]]:
    """One row per budget, every amount and moment formatted for reading."""
    cur = found.currency
    shown = []
    for f in sorted(found.budgets, key=lambda f: (names.get(f.tenant_id, f.tenant_id), f.scope)):
        if f.spent is None:
            count = f.interactions or 0
            spent = (
                f"largest {formatting.money(f.largest, cur)} "
                f"({formatting.count(count)} interaction{'s' if count != 1 else ''})"
            )
        else:
            spent = formatting.money(f.spent, cur)
        burn = None if f.burn_per_day is None else f"{formatting.money(f.burn_per_day, cur)} / day"
        shown.append(
            {
                "tenant": names.get(f.tenant_id, f.tenant_id),
                "scope": f.scope,
                "period": f.period if f.timezone == "UTC" else f"{f.period} ({f.timezone})",
                "limit": formatting.money(f.limit, cur),
                "spent": spent,
                "reserved": formatting.money(f.reserved, cur),
                "remaining": formatting.money(f.remaining, cur),
                "burn rate": burn or formatting.MISSING,
                "runs out": runs_out(f, zone),
                "period start": formatting.minute(f.period_start, zone)
                if f.resets is not None
                else "–",
                "resets": formatting.minute(f.resets, zone) if f.resets else "never (total)",
            }
        )
    return shown


def table(found: Budgets, names: dict[str, str], zone: ZoneInfo) -> None:
    """The budgets table with its caption; a one-line note when there are none."""
    if not found.budgets:
        st.info(NO_BUDGETS, icon=":material/info:")
        return
    tables.wide(rows(found, names, zone), COLUMNS, key="budget_table")
    st.caption(CAPTION.format(now=formatting.minute(found.at, zone), zone=zone.key))


def refusals(found: Budgets, view: View) -> None:
    """Refused requests per bucket, budget apart from rate limit; a note when none were."""
    if not any(r.total for _, r in found.refusals):
        st.caption("No request was refused at admission in this period.")
        return
    points = [
        Point(formatting.wall_clock(start, view.zone), name, getattr(counts, field))
        for field, name in SERIES.items()
        for start, counts in found.refusals
    ]
    st.altair_chart(
        charts.trend(
            points,
            title=f"Refusals per {view.bucket}",
            y_title="refused requests",
            y_format=",.0f",
            bucket=view.bucket,
            x_title=f"{view.bucket} starting ({view.zone.key})",
            y_step=1,
        ),
        width="stretch",
    )
    st.caption(
        f"Requests turned away at admission each {view.bucket}, before any upstream was "
        "called: by a budget that could not cover the request's largest possible cost "
        "(402) or by a rate limit (429). Refused requests cost nothing."
    )
