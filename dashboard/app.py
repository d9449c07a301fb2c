"""The kvgate dashboard: ``kvgate dashboard`` runs ``streamlit run`` on this file.

The sidebar's controls (zone, period, tenants, models) are shared by every page; each
page reads them through ``context.current()``. Nothing from the database is read (but the
look-up of an API key submitted to sign in), and no page registered, before
``access.viewer`` lets the session in. A tenant signed in with its key gets ``only``: every
look-up and the view are cut to its data, and the operator's fleet pages are not registered.
"""

from __future__ import annotations

import logging
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo, available_timezones

import streamlit as st

from dashboard import access, context
from dashboard.launcher import OPEN_WARNING
from dashboard.view import GRANULARITIES, View
from gateway.config import Settings
from gateway.db import lookups
from gateway.db.session import DatabaseError, SessionFactory

log = logging.getLogger("kvgate.dashboard")

PAGES = Path(__file__).parent / "screens"


def period(zone: ZoneInfo, traffic: tuple[datetime, datetime] | None) -> tuple[date, date]:
    """The days chosen; at first the week up to today, or up to the last traffic if older."""
    today = datetime.now(zone).date()
    last = (
        today
        if traffic is None
        else min(today, (traffic[1] - timedelta(seconds=1)).astimezone(zone).date())
    )
    chosen = st.sidebar.date_input(
        "Period (days in your zone)",
        value=(last - timedelta(days=6), last),
        key="period",
        format="YYYY-MM-DD",
    )
    days = [d for d in (chosen if isinstance(chosen, tuple | list) else (chosen,)) if d]
    if not days:
        return last, last
    return days[0], days[-1]  # one day picked so far: that day alone


@st.cache_resource(show_spinner=False)
def warn_open() -> None:
    """Say once per server process that anyone who reaches the port sees everything."""
    log.warning("warning: %s", OPEN_WARNING)


def key_lookup(sessions: SessionFactory) -> access.KeyLookup:
    """Sign-in's look-up of a tenant's API key in the database (unreachable: no one)."""

    def find(key: str) -> access.Viewer | None:
        try:
            with sessions() as session:
                held = lookups.key_holder(session, key)
        except DatabaseError:
            log.exception("dashboard sign-in could not look the API key up")
            return None
        return None if held is None else access.Viewer(tenant_id=held[1], key_id=held[0])

    return find


def still_valid(sessions: SessionFactory, viewer: access.Viewer) -> bool:
    """A tenant's session lasts while its key does: revoked, the next run signs it out."""
    if viewer.key_id is None:
        return True
    with sessions() as session:
        return lookups.key_active(session, viewer.key_id)


def main() -> None:
    """One run of the dashboard: sign-in, the sidebar's view of the data, then the page shown."""
    st.set_page_config(page_title="kvgate", page_icon=":material/savings:", layout="wide")
    # Exact money has many digits: a smaller metric font shows them whole in four columns.
    # A tile's title and the words beside its change wrap instead of ending in an ellipsis
    # (Streamlit keeps them to one line: "Spend on failed or retried atte…" at 1500 px),
    # the words going under the change when both do not fit on one line.
    st.html(
        "<style>[data-testid='stMetricValue'] {font-size: 1.55rem;}"
        " [data-testid='stMetricLabel'] *, [data-testid='stMetricDeltaDescription'] *"
        " {white-space: normal !important; overflow: visible !important;"
        " text-overflow: clip !important;}"
        " [data-testid='stMetric'] div:has(> [data-testid='stMetricDelta'])"
        " {flex-wrap: wrap;}</style>"
    )
    settings = Settings()
    refusal = settings.dashboard_refusal()
    if refusal is not None:  # `streamlit run` by hand; `kvgate dashboard` refuses to start
        st.error(refusal)
        return
    if settings.dashboard_password is None:
        warn_open()
    sessions = context.sessions(settings.database_url)
    viewer = access.viewer(settings, key_lookup(sessions))
    if viewer is None:
        return
    if not still_valid(sessions, viewer):
        access.sign_out()
        st.rerun()
    only = viewer.tenant_id  # a tenant signed in: its data alone, from every query here on
    with sessions() as session:
        names = lookups.tenant_names(session, only)
        models = lookups.models(session, only)
        traffic = lookups.traffic_span(session, only)
    st.sidebar.title("kvgate")
    if settings.dashboard_password is not None:
        st.sidebar.button("Sign out", key="kvgate.sign_out", on_click=access.sign_out)
    zones = sorted(available_timezones() | {"UTC"})
    zone = ZoneInfo(st.sidebar.selectbox("Time zone", zones, index=zones.index("UTC"), key="zone"))
    start, end = period(zone, traffic)
    if only is None:
        tenant_ids = st.sidebar.multiselect(
            "Tenants",
            list(names),
            format_func=names.__getitem__,
            placeholder="all tenants",
            key="tenants",
        )
    else:
        st.sidebar.caption(f"Signed in as tenant **{names.get(only, only)}**: its own figures.")
        tenant_ids = [only]
    chosen_models = st.sidebar.multiselect("Models", models, placeholder="all models", key="models")
    granularity = st.sidebar.selectbox(
        "Chart granularity",
        GRANULARITIES,
        key="granularity",
        help="auto: hourly while the traffic shown spans at most 3 days, daily up to 90 "
        "days, weekly beyond.",
    )
    view = View(
        zone,
        start,
        end,
        tuple(tenant_ids),
        tuple(chosen_models),
        granularity=granularity,
        traffic=traffic,
    )
    if view.snapped:
        st.sidebar.caption(
            f"{zone.key} is not a whole number of hours from UTC; days here "
            "start on the UTC hour before local midnight."
        )
    context.publish(context.Context(sessions, view, traffic, only))
    pages = [
        st.Page(PAGES / "overview.py", title="Overview", icon=":material/dashboard:", default=True),
        st.Page(
            PAGES / "tenants.py",
            title="Tenants" if only is None else "Your figures",
            icon=":material/groups:",
        ),
        st.Page(PAGES / "models.py", title="Models and prices", icon=":material/sell:"),
        st.Page(PAGES / "requests.py", title="Requests", icon=":material/receipt_long:"),
        # Prefix breakers and reconciliation with the replicas (issue 19).
        st.Page(PAGES / "breakers.py", title="Cache economics", icon=":material/troubleshoot:"),
    ]
    if only is None:  # per replica, every tenant's traffic together: the operator's alone
        pages.insert(3, st.Page(PAGES / "routing.py", title="Routing", icon=":material/alt_route:"))
    navigation = st.navigation(pages)
    access.land(pages, navigation)
    navigation.run()


# Streamlit runs this file as __main__. A writer process started by the same Python (tests
# run the dashboard in-process) imports the parent's main module again under another name:
# it must not run the app there.
if __name__ == "__main__":
    main()
