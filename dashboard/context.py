"""What every page needs, set up once per run by ``app.py``: sessions and the view."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import streamlit as st

from dashboard import formatting
from dashboard.view import View
from gateway.db.session import Engine, SessionFactory, make_engine, session_factory

KEY = "kvgate.context"
NO_TRAFFIC = (
    "No traffic yet. Point an OpenAI client at the gateway "
    '(`OpenAI(base_url="http://<gateway>:8000/v1", api_key=...)`, a key from '
    "`kvgate keys create --tenant NAME`), or run `kvgate demo`; requests appear here "
    "within a second of finishing."
)


@dataclass(frozen=True, slots=True)
class Context:
    sessions: SessionFactory
    view: View
    # First hour with traffic and end of the last one; None: the database has no requests.
    traffic: tuple[datetime, datetime] | None
    # The tenant signed in with one of its keys: every page shows its data alone. None: the
    # operator, who sees every tenant.
    only: str | None = None

    @property
    def tenant_ids(self) -> tuple[str, ...]:
        """The tenants whose figures may be shown: the signed-in tenant alone, else the
        sidebar's choice (none: all)."""
        if self.only is not None:
            return (self.only,)
        return self.view.tenant_ids


# The memory each of the dashboard's sorts and hashes may take on Postgres. Grouped over
# a month of hourly rollups (500,000 TTFT rows at 1,000,000 records), the planner, which
# cannot tell how few buckets they fall in, sorts them on disk at the default 4 MB: twice
# the time of the hash it picks with this (benchmarks/README.md, Dashboard).
WORK_MEM = "64MB"


@st.cache_resource(show_spinner=False)
def engine(url: str) -> Engine:
    """One pooled engine per database for the whole server, shared by every session."""
    return make_engine(url, work_mem=WORK_MEM)


def sessions(url: str) -> SessionFactory:
    """A session factory on the server's one engine for the database at ``url``."""
    return session_factory(engine(url))


def publish(context: Context) -> None:
    """Make ``context`` the one every page of this run reads."""
    st.session_state[KEY] = context


def current() -> Context:
    """The context ``app.py`` set for this run."""
    context: Context = st.session_state[KEY]
    return context


def has_traffic(context: Context, *, in_view: bool) -> bool:
    """Say what to do when there is nothing to show; True when there is something."""
    if context.traffic is None:
        st.info(NO_TRAFFIC, icon=":material/info:")
        return False
    if not in_view:
        first, last = context.traffic
        zone = context.view.zone
        st.info(
            "No requests in this period. Traffic runs from "
            f"{formatting.moment(first, zone)} to {formatting.moment(last, zone)} "
            f"({zone.key}): widen the period in the sidebar.",
            icon=":material/info:",
        )
        return False
    return True
