"""How a tile's figure moved since the previous period: the delta, its colour, the help line.

The previous period is as many days just before the view's, with the same tenants, models
and zone (``View.previous``). A tile compares only when both periods have a value; with
no traffic before, it shows no delta and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal, TypeVar

from dashboard import formatting
from dashboard.view import View

T = TypeVar("T", Decimal, int, float)
# Which way is good news: up (hit rate), down (cost, failures, TTFT), or neither (spend).
Better = Literal["higher", "lower", "neither"]
Color = Literal["normal", "inverse", "off"]
COLORS: dict[Better, Color] = {"higher": "normal", "lower": "inverse", "neither": "off"}


@dataclass(frozen=True, slots=True)
class Change:
    """What a tile shows of the previous period."""

    delta: str | None
    color: Color
    # A sentence for the tile's help: the previous value exactly, or why there is none.
    previous: str

    moved: bool = False  # False: no change (no arrow, no colour), or nothing to compare

    @property
    def arrow(self) -> Literal["auto", "off"]:
        """An arrow only for a change that goes somewhere."""
        return "auto" if self.moved else "off"


@dataclass(frozen=True, slots=True)
class Before:
    """The previous period, and whether it had any traffic to compare with."""

    view: View
    had_traffic: bool

    @property
    def period(self) -> str:
        """'2026-06-28 to 2026-06-29'."""
        return f"{self.view.start} to {self.view.end}"

    @property
    def description(self) -> str:
        """What the delta is measured against, shown beside it."""
        days = self.view.days
        return f"vs previous {days} day{'s' if days != 1 else ''}"

    def compare(
        self,
        now: T | None,
        before: T | None,
        *,
        show: Callable[[T | None], str],
        change: Callable[[T], str],
        better: Better,
    ) -> Change:
        """The change from ``before`` to ``now``: ``change(now - before)``, coloured as
        ``better`` says (none when either has no value); ``show`` writes the previous
        value into the help line."""
        if not self.had_traffic:
            return Change(None, "off", f"No traffic in the previous period ({self.period}).")
        previous = f"Previous period ({self.period}): {show(before)}."
        if now is None or before is None:
            return Change(None, "off", previous)
        difference = now - before
        moved = bool(difference)
        return Change(change(difference), COLORS[better] if moved else "off", previous, moved)

    def money(
        self,
        now: Decimal | None,
        before: Decimal | None,
        currency: str | None,
        before_currency: str | None,
        *,
        better: Better,
    ) -> Change:
        """A change of money (none when either period priced nothing, or across currencies)."""
        comparable = currency is not None and before_currency in (None, currency)
        return self.compare(
            now if comparable else None,
            before if before_currency is not None else None,
            show=lambda v: formatting.money(v, currency),
            change=lambda d: formatting.money_change(d, currency),
            better=better,
        )

    def share(self, now: Decimal | None, before: Decimal | None, *, better: Better) -> Change:
        """A change of a share, in percentage points."""
        return self.compare(
            now, before, show=formatting.percent, change=formatting.points, better=better
        )

    def count(self, now: int, before: int, *, better: Better) -> Change:
        """A change of a count."""
        return self.compare(
            now,
            before,
            show=lambda v: formatting.MISSING if v is None else formatting.count(v),
            change=formatting.count_change,
            better=better,
        )

    def millis(self, now: float | None, before: float | None) -> Change:
        """A change of a TTFT percentile (lower is better)."""
        return self.compare(
            now, before, show=formatting.millis, change=formatting.millis_change, better="lower"
        )
