"""Tables that read as a person expects: no cell says None or nan, and they fit the page.

Every table on the dashboard goes through ``table`` (or ``wide``), which gives each empty
cell (None, NaN, an empty string) a text: the column's own where the page says what the
gap means ("no routing data yet", "unpriced"), else "–". Shares arrive as text from
``formatting.percent`` (a number column's format showed a missing share as "None").

A wide table scrolls sideways at 1500 px, so the page shows the columns a reader needs
first and keeps the whole table under an "All columns" expander (the download, where
there is one, has every column too). Money cells are text from ``formatting.money``: a
number column's format could round a small amount to 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from dashboard import formatting

ALL = "All columns"


def empty(value: Any) -> bool:
    """Whether a cell would show nothing a reader could use: None, NaN or ''."""
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def share(value: Decimal | None) -> str | None:
    """A share as the tables show it ('42.3 %'); None stays None, for the column's text."""
    return None if value is None else formatting.percent(value)


def readable(
    rows: Sequence[Mapping[str, Any]], missing: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The rows with every empty cell given its column's text in ``missing``, or "–".

    A column given a text for a gap becomes text throughout (counts with their thousands
    separators): a column is one type to Arrow, and a mixed one is logged as an error.
    """
    gaps = missing or {}
    texts = {name for row in rows for name, value in row.items() if empty(value)}
    return [
        {
            name: gaps.get(name, formatting.MISSING)
            if empty(value)
            else _text(value)
            if name in texts
            else value
            for name, value in row.items()
        }
        for row in rows
    ]


def _text(value: Any) -> Any:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return formatting.count(value)
    if isinstance(value, float):
        return f"{value:,}"
    return value


def table(
    rows: Sequence[Mapping[str, Any]],
    *,
    key: str,
    missing: Mapping[str, str] | None = None,
    into: DeltaGenerator | None = None,
    **options: Any,
) -> Any:
    """``st.dataframe`` (in ``into``, else the page) of the readable rows, no index."""
    return (into or st).dataframe(readable(rows, missing), hide_index=True, key=key, **options)


def key_columns(rows: Sequence[Mapping[str, Any]], shown: Sequence[str]) -> list[dict[str, Any]]:
    """The rows with only the ``shown`` columns, in that order."""
    return [{name: row[name] for name in shown} for row in rows]


def wide(
    rows: Sequence[Mapping[str, Any]],
    shown: Sequence[str],
    *,
    key: str,
    missing: Mapping[str, str] | None = None,
    column_config: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """The key columns as the table (``options``: more ``st.dataframe`` arguments, as for a
    selection), and the whole rows under an expander; returns the main table."""
    config = dict(column_config or {})
    main = table(
        key_columns(rows, shown),
        key=key,
        missing=missing,
        column_config={name: c for name, c in config.items() if name in shown},
        **options,
    )
    with st.expander(ALL):
        table(rows, key=f"{key}_all", missing=missing, column_config=config)
    return main
