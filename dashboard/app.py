"""The kvgate dashboard: ``kvgate dashboard`` runs ``streamlit run`` on this file.

The sidebar's controls (zone, period, tenants, models) are shared by every page; each
page reads them through ``context.current()``. Nothing from the database is read, and no
page registered, before ``access.viewer`` lets the session in.
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
    logging.getLogger("kvgate.dashboard").warning("warning: %s", OPEN_WARNING)


def main() -> None:
    """One run of the dashboard: sign-in, the sidebar's view of the data, then the page shown."""
    st.set_page_config(page_title="kvgate", page_icon=":material/savings:", layout="wide")
    # Exact money has many digits: a smaller metric font shows them whole in four columns.
    st.html("<style>[data-testid='stMetricValue'] {font-size: 1.55rem;}</style>")
    settings = Settings()
    refusal = settings.dashboard_refusal()
    if refusal is not None:  # `streamlit run` by hand; `kvgate dashboard` refuses to start
        st.error(refusal)
        return
    if settings.dashboard_password is None:
        warn_open()
    viewer = access.viewer(settings)
    if viewer is None:
        return
    sessions = context.sessions(settings.database_url)
    with sessions() as session:
        names = lookups.tenant_names(session)
        models = lookups.models(session)
        traffic = lookups.traffic_span(session)
    st.sidebar.title("kvgate")
    if settings.dashboard_password is not None:
        st.sidebar.button("Sign out", key="kvgate.sign_out", on_click=access.sign_out)
    zones = sorted(available_timezones() | {"UTC"})
    zone = ZoneInfo(st.sidebar.selectbox("Time zone", zones, index=zones.index("UTC"), key="zone"))
    start, end = period(zone, traffic)
    tenant_ids = st.sidebar.multiselect(
        "Tenants",
        list(names),
        format_func=names.__getitem__,
        placeholder="all tenants",
        key="tenants",
    )
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
    context.publish(context.Context(sessions, view, traffic, viewer))
    pages = [
        st.Page(PAGES / "overview.py", title="Overview", icon=":material/dashboard:", default=True),
        st.Page(PAGES / "tenants.py", title="Tenants", icon=":material/groups:"),
        st.Page(PAGES / "models.py", title="Models and prices", icon=":material/sell:"),
        st.Page(PAGES / "routing.py", title="Routing", icon=":material/alt_route:"),
        st.Page(PAGES / "requests.py", title="Requests", icon=":material/receipt_long:"),
        # Prefix breakers and reconciliation with the replicas (issue 19).
        st.Page(PAGES / "breakers.py", title="Cache economics", icon=":material/troubleshoot:"),
    ]
    navigation = st.navigation(pages)
    access.land(pages, navigation)
    navigation.run()


# Streamlit runs this file as __main__. A writer process started by the same Python (tests
# run the dashboard in-process) imports the parent's main module again under another name:
# it must not run the app there.
if __name__ == "__main__":
    main()
