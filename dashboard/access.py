"""Who may see the dashboard: the operator, signed in with ``KVGATE_DASHBOARD_PASSWORD``.

``app.py`` asks ``viewer()`` before it reads the database, draws the sidebar or calls
``st.navigation``, so until sign-in no page script runs, whatever page the URL names, and
nothing but this form reaches the browser. Without a password (development only:
``Settings.dashboard_refusal`` stops a production dashboard) everyone is the operator.

The signed-in viewer lives in the session's state as a ``Viewer``: a browser can set
widget values, never a Python object of this type. Issue 16's tenant view signs a tenant
in with one of its API keys as ``Viewer(tenant_id=...)``, and pages scope by it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

import streamlit as st
from streamlit.navigation.page import StreamlitPage

from dashboard.throttle import Throttle, client_of
from gateway.config import Settings

KEY = "kvgate.viewer"
PASSWORD = "kvgate.password"
LANDING = "kvgate.landing"
WRONG = "That is not the dashboard password."
log = logging.getLogger("kvgate.dashboard")


@dataclass(frozen=True, slots=True)
class Viewer:
    """Whose figures a session may see."""

    # None: every tenant's (the operator).
    tenant_id: str | None = None


OPERATOR = Viewer()


@st.cache_resource(show_spinner=False)
def throttle(max_failures: int, lockout_s: float) -> Throttle:
    """The one throttle of this server process, shared by every session."""
    return Throttle(max_failures=max_failures, lockout_s=lockout_s)


def password_matches(given: str, password: str) -> bool:
    """Constant time: digests are compared, so neither content nor length shows in timing."""
    return hmac.compare_digest(
        hashlib.sha256(given.encode()).digest(), hashlib.sha256(password.encode()).digest()
    )


def viewer(settings: Settings) -> Viewer | None:
    """The session's viewer; None (the sign-in form drawn) until someone signs in."""
    password = settings.dashboard_password
    if password is None:
        return OPERATOR
    current = st.session_state.get(KEY)
    if isinstance(current, Viewer):
        return current
    sign_in(settings, password)
    return None


def sign_in(settings: Settings, password: str) -> None:
    """The form, and one throttled comparison per submission."""
    gate = throttle(settings.dashboard_max_failures, settings.dashboard_lockout_s)
    client = client_of(st.context.ip_address)
    st.title("kvgate")
    with st.form("kvgate.sign_in", clear_on_submit=True, border=False):
        given = st.text_input("Dashboard password", type="password", key=PASSWORD)
        submitted = st.form_submit_button("Sign in")
    if not submitted or not given:
        locked = gate.locked_for(client, now=time.monotonic())
        if locked:
            st.error(locked_message(locked))
        return
    verdict = gate.attempt(client, lambda: password_matches(given, password), now=time.monotonic())
    if verdict.accepted:
        st.session_state[KEY] = OPERATOR
        st.session_state[LANDING] = page_path(st.context.url)
        st.rerun()
    if verdict.compared:  # one line per guess looked at; a locked client's are not
        lock = f"; locked for {verdict.locked_for_s:.0f} s" if verdict.locked_for_s else ""
        log.warning("failed dashboard sign-in from %s%s", client, lock)
    st.error(locked_message(verdict.locked_for_s) if verdict.locked_for_s else WRONG)


def locked_message(seconds: float) -> str:
    """What a locked-out address is told: the whole seconds until it may try again."""
    return f"Too many failed sign-ins from your address: try again in {math.ceil(seconds)} s."


def page_path(url: str | None) -> str | None:
    """The page a browser URL names: its last path segment ('' for the default page)."""
    if not isinstance(url, str):
        return None  # no browser told (a raw client, AppTest): stay on the page resolved
    return urlparse(url).path.rstrip("/").rpartition("/")[2]


def land(pages: Sequence[StreamlitPage], current: StreamlitPage) -> None:
    """Just signed in: go to the page the URL named, as the form ran on no page at all."""
    path = st.session_state.pop(LANDING, None)
    target = next((page for page in pages if page.url_path == path), None)
    if target is not None and target.url_path != current.url_path:
        st.switch_page(target)


def sign_out() -> None:
    """Forget the session's viewer; the next run shows the form."""
    st.session_state.pop(KEY, None)
