"""Sums: the tokens and money a set of attempts adds up to, written down once.

Statement lines, statement totals, the dashboard's figures and the requests page all read
the same value, summed in SQL by the same expressions, so they cannot disagree on what a
class of tokens or money is:

    requests                        attempts summed (one, for a single attempt)
    uncached … output tokens        the four disjoint classes (``pricing.tokens.TokenClasses``,
                                    which usage and bills share), and the 1-hour part of writes
    cost_uncached … cost_output     exact Decimal money per class (``Money`` columns)
    cost_total                      the stored sum of the classes
    cost_uncached_equivalent        what the same tokens would have cost with no cache

Every table these are read from (``requests`` and the ``usage_hours`` rollup) has a column
of each name; a rollup also has ``requests``, the count of attempts it sums.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, FromClause, Integer, func, literal

from pricing.cost import ZERO
from pricing.tokens import TokenClasses

TOKENS = (
    "uncached_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "output_tokens",
)
COSTS = (
    "cost_uncached",
    "cost_cache_read",
    "cost_cache_write",
    "cost_output",
    "cost_total",
    "cost_uncached_equivalent",
)
FIELDS = ("requests", *TOKENS, *COSTS)


@dataclass(frozen=True, slots=True)
class Sums(TokenClasses):
    """Attempts, tokens per class and money per class, summed exactly."""

    requests: int = 0
    cache_write_1h_tokens: int = 0
    cost_uncached: Decimal = ZERO
    cost_cache_read: Decimal = ZERO
    cost_cache_write: Decimal = ZERO
    cost_output: Decimal = ZERO
    cost_total: Decimal = ZERO
    cost_uncached_equivalent: Decimal = ZERO

    @property
    def tokens(self) -> int:
        """Prompt and output tokens (``cache_write_1h_tokens`` is part of the writes)."""
        return self.prompt_tokens + self.output_tokens

    def __add__(self, other: Sums) -> Sums:
        return Sums(**{name: getattr(self, name) + getattr(other, name) for name in FIELDS})

    def as_dict(self) -> dict[str, int | Decimal]:
        """Field name → value, in field order."""
        return {name: getattr(self, name) for name in FIELDS}


def columns(table: FromClause) -> list[ColumnElement[Any]]:
    """SUM of every field over ``table``'s rows in a group, labelled with the field names.

    A table without a ``requests`` column (the requests table) counts its rows instead.
    """
    count: ColumnElement[Any] = (
        func.sum(table.c.requests) if "requests" in table.c else func.count()
    )
    labelled: list[ColumnElement[Any]] = [count.label("requests")]
    labelled += [func.sum(table.c[name]).label(name) for name in (*TOKENS, *COSTS)]
    return labelled


def row_columns(table: FromClause) -> list[ColumnElement[Any]]:
    """The fields of one row of the requests table, unsummed: one attempt's sums."""
    labelled: list[ColumnElement[Any]] = [literal(1, Integer).label("requests")]
    labelled += [table.c[name].label(name) for name in (*TOKENS, *COSTS)]
    return labelled


def from_row(row: Mapping[Any, Any]) -> Sums:
    """A row selected with ``columns`` (SUM over no rows is NULL: zero here)."""
    values: dict[str, Any] = {name: int(row[name] or 0) for name in ("requests", *TOKENS)}
    values |= {name: ZERO if row[name] is None else row[name] for name in COSTS}
    return Sums(**values)
