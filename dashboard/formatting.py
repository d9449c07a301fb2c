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


def money_change(change: Decimal, currency: str | None) -> str:
    """A change of money, signed first so the tile reads its direction: '+USD 0.0012'."""
    sign = "-" if change < 0 else "+" if change > 0 else ""
    return f"{sign}{money(abs(change), currency)}"


def points(change: Decimal) -> str:
    """A change of a share in percentage points: '+1.2 pp', '-0.04 pp', '0.0 pp'.

    Tenths of a point, or as many more places as it takes for a change not to read as none.
    """
    places = Decimal("0.1")
    shown = (change * 100).quantize(places, ROUND_HALF_EVEN)
    while change and not shown and places > NANO:
        places /= 10
        shown = (change * 100).quantize(places, ROUND_HALF_EVEN)
    return f"{shown:+f} pp" if shown else f"{abs(shown)} pp"


def count_change(change: int) -> str:
    """A change of a count: '+3', '-1,204', '0'."""
    return f"{change:+,}" if change else "0"


def millis_change(change: float) -> str:
    """A change of a TTFT in milliseconds: '+12 ms', '-3.5 ms', '0 ms'."""
    if not change:
        return "0 ms"
    return f"{change:+,.0f} ms" if abs(change) >= 10 else f"{change:+.1f} ms"


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
