"""Overview: what traffic cost, what the cache was worth, how fast first tokens came."""

from __future__ import annotations

import streamlit as st

from dashboard import context, data, panels

ctx = context.current()
view = ctx.view
st.title("Overview")
with ctx.sessions() as session:
    overview = data.overview(session, view)
if context.has_traffic(ctx, in_view=overview.totals.sums.requests > 0):
    st.caption(
        f"{view.start} to {view.end} ({view.zone.key}), per {view.bucket}; "
        f"{overview.totals.sums.requests:,} attempts."
    )
    panels.metrics(overview, view)
    panels.trends(overview, view)
    if note := panels.adjusted_note(overview):
        st.caption(f":material/edit_note: {note}")
