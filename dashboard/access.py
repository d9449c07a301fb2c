"""Who may see the dashboard: the operator, signed in with ``KVGATE_DASHBOARD_PASSWORD``.

``app.py`` asks ``viewer()`` before it reads the database, draws the sidebar or calls
``st.navigation``, so until sign-in no page script runs, whatever page the URL names, and
nothing but this form reaches the browser. Without a password (development only:
``Settings.dashboard_refusal`` stops a production dashboard) everyone is the operator.

The signed-in viewer lives in the session's state as a ``Viewer``: a browser can set
widget values, never a Python object of this type. The operator signs in with the
password and sees every tenant. A tenant signs in with one of its active API keys (the
form's second field; looked up by its hash, throttled like a password) as
``Viewer(tenant_id=...)``: ``app.py`` then reads, lists and shows that tenant's data alone,
leaves out the pages of fleet-wide figures, and signs the session out on the first run
after the key is revoked.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

import streamlit as st
from streamlit.navigation.page import StreamlitPage

from dashboard.throttle import Throttle, client_of
from gateway.config import Settings

KEY = "kvgate.viewer"
PASSWORD = "kvgate.password"
API_KEY = "kvgate.api_key"
LANDING = "kvgate.landing"
WRONG = "That is not the dashboard password."
WRONG_KEY = "That is not an active API key."
log = logging.getLogger("kvgate.dashboard")


@dataclass(frozen=True, slots=True)
class Viewer:
    """Whose figures a session may see."""

    # None: every tenant's (the operator).
    tenant_id: str | None = None
    key_id: str | None = None  # a tenant's: the API key it signed in with


OPERATOR = Viewer()
# A full API key → the viewer it signs in (its tenant), or None for no active key.
KeyLookup = Callable[[str], Viewer | None]


@st.cache_resource(show_spinner=False)
def throttle(max_failures: int, lockout_s: float) -> Throttle:
    """The one throttle of this server process, shared by every session."""
    return Throttle(max_failures=max_failures, lockout_s=lockout_s)


def password_matches(given: str, password: str) -> bool:
    """Constant time: digests are compared, so neither content nor length shows in timing."""
    return hmac.compare_digest(
        hashlib.sha256(given.encode()).digest(), hashlib.sha256(password.encode()).digest()
    )


def viewer(settings: Settings, find_key: KeyLookup) -> Viewer | None:
    """The session's viewer; None (the sign-in form drawn) until someone signs in."""
    password = settings.dashboard_password
    if password is None:
        return OPERATOR
    current = st.session_state.get(KEY)
    if isinstance(current, Viewer):
        return current
    sign_in(settings, password, find_key)
    return None


def sign_in(settings: Settings, password: str, find_key: KeyLookup) -> None:
    """The form, and one throttled check per submission: the password, else the API key."""
    gate = throttle(settings.dashboard_max_failures, settings.dashboard_lockout_s)
    client = client_of(st.context.ip_address)
    st.title("kvgate")
    with st.form("kvgate.sign_in", clear_on_submit=True, border=False):
        given = st.text_input("Dashboard password", type="password", key=PASSWORD)
        key = st.text_input(
            "Or one of your tenant's API keys",
            type="password",
            key=API_KEY,
            help="A tenant sees its own figures and statements only.",
        )
        submitted = st.form_submit_button("Sign in")
    if not submitted or not (given or key):
        locked = gate.locked_for(client, now=time.monotonic())
        if locked:
            st.error(locked_message(locked))
        return
    found: list[Viewer] = []

    def check() -> bool:
        if given and password_matches(given, password):
            found.append(OPERATOR)
        elif key:
            tenant = find_key(key)
            if tenant is not None:
                found.append(tenant)
        return bool(found)

    verdict = gate.attempt(client, check, now=time.monotonic())
    if verdict.accepted:
        st.session_state[KEY] = found[0]
        st.session_state[LANDING] = page_path(st.context.url)
        st.rerun()
    if verdict.compared:  # one line per guess looked at; a locked client's are not
        lock = f"; locked for {verdict.locked_for_s:.0f} s" if verdict.locked_for_s else ""
        log.warning("failed dashboard sign-in from %s%s", client, lock)
    wrong = WRONG if given else WRONG_KEY
    st.error(locked_message(verdict.locked_for_s) if verdict.locked_for_s else wrong)


def locked_message(seconds: float) -> str:
    """What a locked-out address is told: the whole seconds until it may try again."""
    # To the millisecond first: (now + 60) - now is 60.00000000000001 for some clock values.
    whole = math.ceil(round(seconds, 3))
    return f"Too many failed sign-ins from your address: try again in {whole} s."


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
