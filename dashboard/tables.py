"""Tables that fit the page: the key columns shown, every column one click away.

A wide table scrolls sideways at 1500 px, so the page shows the columns a reader needs
first and keeps the whole table under an "All columns" expander (the download, where
there is one, has every column too). Money cells are text from ``formatting.money``: a
number column's format could round a small amount to 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st

ALL = "All columns"


def key_columns(rows: Sequence[Mapping[str, Any]], shown: Sequence[str]) -> list[dict[str, Any]]:
    """The rows with only the ``shown`` columns, in that order."""
    return [{name: row[name] for name in shown} for row in rows]


def wide(
    rows: Sequence[Mapping[str, Any]],
    shown: Sequence[str],
    *,
    key: str,
    column_config: Mapping[str, Any] | None = None,
    **table: Any,
) -> Any:
    """The key columns as the table (``table``: more ``st.dataframe`` arguments, as for a
    selection), and the whole rows under an expander; returns the main table."""
    config = dict(column_config or {})
    main = st.dataframe(
        key_columns(rows, shown),
        hide_index=True,
        key=key,
        column_config={name: c for name, c in config.items() if name in shown},
        **table,
    )
    with st.expander(ALL):
        st.dataframe(list(rows), hide_index=True, key=f"{key}_all", column_config=config)
    return main
