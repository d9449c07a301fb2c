"""The optional dashboard password (``KVGATE_DASHBOARD_PASSWORD``); off when unset."""

from __future__ import annotations

import hmac

import streamlit as st

KEY = "kvgate.signed_in"


def signed_in(password: str | None) -> bool:
    """Ask for the password until it is given; True when the viewer may see the pages."""
    if password is None or st.session_state.get(KEY):
        return True
    st.title("kvgate")
    given = st.text_input("Dashboard password", type="password", key="kvgate.password")
    if given and hmac.compare_digest(given.encode(), password.encode()):
        st.session_state[KEY] = True
        del st.session_state["kvgate.password"]
        st.rerun()
    if given:
        st.error("That is not the dashboard password.")
    return False
