"""Rate limits: requests and tokens per UTC minute, admitted from leases.

Each limit's minute is two counters (``spend.window_counters``; a count held as count x
``UNIT``): its requests, charged one at admission, and its tokens, charged at settlement
with the request's recorded prompt and output tokens. Each worker holds a slice of both
(``gateway/serving/leases.py``, the same machinery as budgets'), so admission makes no
database round trip in the steady state, and a minute's requests never pass its cap,
whatever the concurrency and however many workers and gateways share the database: the
counter's count and every worker's slice together stay within the cap, resized under the
counter's row lock. The next minute's slice is taken just before it begins, by a worker
using the current one.

The bound. A worker holds at most ``max(5 % of the cap, 8 requests)`` of a minute's
requests (tokens: ``max(5 %, 8 x the most tokens a request of it recorded)``) unused, for
at most a second after its last request there (then, and when the minute ends, it gives
it back). A request can be refused while other workers hold that much of the minute; when
every worker keeps busy, each uses what it holds and the minute admits exactly its cap.
A request is admitted while its worker's slice has tokens left, its tokens counted when it
is recorded: requests in flight can take a minute past its token cap (as when the database
counted them per request). The ``x-ratelimit-remaining-*`` headers say what this worker
knows: the counters as of its last sync (a second ago at most, while it is busy) and what
it counted since. A killed worker's slice is swept after the hold TTL; the requests it
admitted since its last flush (a second at most) were not flushed, so with a TTL under a
minute they could be admitted again in the same minute (with the default 60 s its slice
returns after its minute has ended).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from gateway.budgets import RateLimit
from gateway.db.spend import Charge, to_units, window_counters
from gateway.serving.leases import Key, Leases

MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
# The counters hold money (Numeric(18, 9) on Postgres: under 10^9), so a count is kept
# there as count x 10^-7: whole counts stay exact, and the largest cap (10^15 tokens) fits.
UNIT = Decimal("0.0000001")
COUNT = to_units(UNIT)  # a count in lease units (``spend.UNITS``)


def units(count: int) -> Decimal:
    """A count of requests or tokens as its counters hold it."""
    return count * UNIT


def count_of(amount: Decimal) -> int:
    """The whole count a counter's amount stands for."""
    return int(amount / UNIT)


def minute(at: datetime) -> datetime:
    """The start of the UTC minute ``at`` falls in."""
    return at.replace(second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class Window:
    """One limit's count in the current minute, after an admission (or its refusal)."""

    limit: RateLimit
    requests: int
    tokens: int
    admitted: bool


@dataclass(frozen=True, slots=True)
class Rated:
    """What a request charges its rate limits' minutes: one request, then its tokens."""

    requests: tuple[Charge, ...]
    tokens: tuple[Charge, ...]
    end: datetime  # the minute's end
    # Every charge, to take at admission (tokens: nothing, but some must be left), in key
    # order; and each kind of x-ratelimit-* header's names and counters, with their caps
    # (and each cap as its header's value).
    all: tuple[Charge, ...] = field(init=False, compare=False)
    caps: tuple[tuple[tuple[bytes, bytes, bytes], tuple[tuple[Key, int, bytes], ...]], ...] = field(
        init=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "all", tuple(sorted((*self.requests, *self.tokens), key=lambda c: c.key))
        )
        caps = tuple(
            (
                tuple(
                    f"x-ratelimit-{name}-{kind}".encode("latin-1")
                    for name in ("limit", "remaining", "reset")
                ),
                tuple((c.key, cap, b"%d" % cap) for c in charges for cap in [count_of(c.limit)]),
            )
            for kind, charges in (("requests", self.requests), ("tokens", self.tokens))
        )
        object.__setattr__(self, "caps", tuple((names, found) for names, found in caps if found))


def rated(limits: tuple[RateLimit, ...], window: datetime) -> Rated:
    """The charges of one request on each limit's counters of the minute ``window``."""
    requests: list[Charge] = []
    tokens: list[Charge] = []
    end = window + MINUTE
    for limit in limits:
        names = window_counters(limit.id)
        for name, cap, amount, into in (
            (names[0], limit.requests_per_minute, UNIT, requests),
            (names[1], limit.tokens_per_minute, Decimal(0), tokens),
        ):
            if cap is not None:
                into.append(Charge(name, "", window, units(cap), amount, end))
    return Rated(tuple(requests), tuple(tokens), end)


class Minutes:
    """``rated``, made once per minute for each set of limits (the hot path's share)."""

    def __init__(self) -> None:
        self.window: datetime | None = None
        self.end: datetime | None = None
        self.made: dict[tuple[str, ...], tuple[tuple[RateLimit, ...], Rated]] = {}

    def minute(self, at: datetime) -> datetime:
        """The start of the UTC minute ``at`` falls in (the last one's, while it lasts)."""
        if self.window is None or self.end is None or not self.window <= at < self.end:
            return minute(at)
        return self.window

    def rated(self, limits: tuple[RateLimit, ...], window: datetime) -> Rated:
        """The charges of one request on each limit's counters of the minute ``window``."""
        if window != self.window:
            self.made.clear()
            self.window, self.end = window, window + MINUTE
        key = tuple(limit.id for limit in limits)
        found = self.made.get(key)
        if found is None or found[0] != limits:  # a limit changed: made again
            found = self.made[key] = (limits, rated(limits, window))
        return found[1]


def admitted_fields(leases: Leases, rate: Rated, at: datetime) -> list[tuple[bytes, bytes]]:
    """``rate_headers`` of an admitted request (no limit refused it), from its charges'
    slices, as the reply's raw header fields (lower-case names, latin-1, as a reply's
    ``raw_headers`` holds them): what the hot path asks of every request of a limited key,
    with no call per header."""
    fields: list[tuple[bytes, bytes]] = []
    if not rate.caps:
        return fields
    seconds = (rate.end - at) / SECOND  # total_seconds(), the same float, with no call
    reset = b"%.3fs" % (seconds if seconds > 0.0 else 0.0)
    held = leases.leases
    for (limit_name, remaining_name, reset_name), caps in rate.caps:
        left, limit, first = 0, b"", True
        for key, cap, value in caps:
            lease = held.get(key)  # as Leases.total: none held, none counted here
            if lease is None:
                room = cap
            else:  # count_of(lease.total), written out in ints: truncated toward zero
                total = lease.counted + lease.spent + lease.used
                room = cap - (total // COUNT if total >= 0 else -(-total // COUNT))
            if first or room < left:
                left, limit, first = room, value, False
        fields += (
            (limit_name, limit),
            (remaining_name, b"%d" % left if left > 0 else b"0"),
            (reset_name, reset),
        )
    return fields


def by_name(fields: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Raw header fields by name, as ``rate_headers`` gives them."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in fields}


def admitted_headers(leases: Leases, rate: Rated, at: datetime) -> dict[str, str]:
    """``admitted_fields`` by name, as ``rate_headers`` gives them."""
    return by_name(admitted_fields(leases, rate, at))


def windows(
    leases: Leases, limits: tuple[RateLimit, ...], window: datetime, short: Charge | None
) -> list[Window]:
    """Each limit's minute as this worker knows it; the one ``short`` names refused."""
    found = []
    for limit in limits:
        names = window_counters(limit.id)
        requests, tokens = (count_of(leases.total((name, "", window))) for name in names)
        found.append(Window(limit, requests, tokens, short is None or short.budget_id not in names))
    return found


# Each kind of x-ratelimit-* header: a window's cap per minute (None: no cap) and its count.
_RATE_KINDS: tuple[tuple[str, Callable[[Window], int | None], Callable[[Window], int]], ...] = (
    ("requests", lambda w: w.limit.requests_per_minute, lambda w: w.requests),
    ("tokens", lambda w: w.limit.tokens_per_minute, lambda w: w.tokens),
)


def rate_headers(found: list[Window], window: datetime, at: datetime) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers, for the tightest limit of each kind."""
    reset = f"{max((window + MINUTE - at).total_seconds(), 0.0):.3f}s"
    headers: dict[str, str] = {}
    for kind, cap, used in _RATE_KINDS:
        room = [(limit - used(w), limit) for w in found if (limit := cap(w)) is not None]
        if room:
            left, limit = min(room, key=lambda p: p[0])
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(left, 0))
            headers[f"x-ratelimit-reset-{kind}"] = reset
    return headers


def retry_after(window: datetime, at: datetime) -> int:
    """Whole seconds until the next minute (at least one)."""
    return max(int((window + MINUTE - at).total_seconds() + 0.999), 1)
