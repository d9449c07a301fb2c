"""How numbers read on the dashboard. Formatting is the last step: nothing here sums."""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from zoneinfo import ZoneInfo

NANO = Decimal("0.000000001")
MISSING = "–"


def money(amount: Decimal | None, currency: str | None) -> str:
    """'USD 1,234.50', 'USD 0.000857155': every nano-unit kept, at least cents shown.

    Without a currency (nothing priced) the amount stands alone: none is assumed.
    """
    if amount is None:
        return MISSING
    exact = amount.quantize(NANO, ROUND_HALF_EVEN)
    text = f"{exact:,f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    number = f"{whole}.{fraction.ljust(2, '0')}"
    return number if currency is None else f"{currency} {number}"


def rate(per_million: Decimal | None, currency: str | None) -> str:
    """A rate per million tokens."""
    return MISSING if per_million is None else f"{money(per_million, currency)} / 1M tokens"


def percent(share: Decimal | None) -> str:
    """'42.3 %' (shares are exact Decimals; this is the only rounding)."""
    if share is None:
        return MISSING
    shown = (share * 100).quantize(Decimal("0.1"), ROUND_HALF_EVEN)
    if not shown and share:  # never a share of something shown as 0
        return "< 0.1 %" if share > 0 else "> -0.1 %"
    return f"{shown} %"


def count(value: int) -> str:
    """A count with thousands separators: ``12,345``."""
    return f"{value:,}"


def millis(value: float | None) -> str:
    """A TTFT bucket edge: '≤ 137 ms' (the histogram knows no finer)."""
    if value is None:
        return MISSING
    return f"≤ {value:,.0f} ms" if value >= 10 else f"≤ {value:.1f} ms"


def moment(value: datetime | None, zone: ZoneInfo) -> str:
    """A stored UTC moment in the viewer's zone, to the millisecond."""
    if value is None:
        return MISSING
    return value.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def minute(value: datetime, zone: ZoneInfo) -> str:
    """A moment in the viewer's zone, to the minute: '2026-07-21 00:00'."""
    return value.astimezone(zone).strftime("%Y-%m-%d %H:%M")


def wall_clock(value: datetime, zone: ZoneInfo) -> str:
    """Local wall-clock time as a zone-less ISO string, for charts.

    Charts mark it UTC so the browser shows it as given, in the viewer's chosen zone.
    """
    return value.astimezone(zone).replace(tzinfo=None).isoformat() + "Z"
