"""The x-ratelimit-* headers of an admitted request (gateway/serving/rates.py): the hot
path's ``admitted_headers``, read off the request's charges, are exactly what the general
``rate_headers`` of its limits' windows say, for any mix of tenant and key limits, requests
and tokens caps, counts below, at and past a cap, and ties; and what clients read in them."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.budgets import RateLimit, parse_scope
from gateway.db.spend import to_units
from gateway.serving.leases import Lease, Leases
from gateway.serving.rates import (
    admitted_headers,
    minute,
    rate_headers,
    rated,
    units,
    windows,
)

AT = datetime(2026, 12, 1, 12, 0, 41, 250_000, tzinfo=UTC)


def _no_database() -> Any:
    raise AssertionError("no header is worth a database round trip")


def _leases(limits: tuple[RateLimit, ...], counts: dict[str, tuple[int, int, int]]) -> Leases:
    """A worker's slices of each limit's counters: (counted at the last sync, spent since,
    in flight) as counts."""
    leases = Leases(sessions=_no_database, hold_ttl=timedelta(seconds=60), clock=lambda: AT)
    for charge in rated(limits, minute(AT)).all:
        counted, spent, used = counts[charge.budget_id]
        leases.leases[charge.key] = Lease(
            charge.budget_id,
            charge.period_start,
            charge.limit,
            charge.period_end,
            counted=to_units(units(counted)),
            spent=to_units(units(spent)),
            used=to_units(units(used)),
        )
    return leases


def _limit(name: str, requests: int | None, tokens: int | None, key: bool) -> RateLimit:
    scope = parse_scope(f"key:k_{name}" if key else "tenant:acme")
    return RateLimit(
        f"rl_{name}", scope, "t_acme", requests, tokens, key_id=f"k_{name}" if key else None
    )


def test_the_fast_headers_are_the_general_ones() -> None:
    """1,000 random mixes of up to three limits, each with a requests cap, a tokens cap or
    both, counts drawn around the caps (ties included): the same headers, to the byte."""
    rng = random.Random(18)
    window = minute(AT)
    for _ in range(1000):
        limits = []
        for n in range(rng.randint(1, 3)):
            requests, tokens = rng.choice(
                [(rng.choice([5, 10, 10**9]), None), (None, rng.choice([100, 10**15])), (10, 100)]
            )
            limits.append(_limit(str(n), requests, tokens, key=rng.random() < 0.5))
        counts: dict[str, tuple[int, int, int]] = {}
        for charge in rated(tuple(limits), window).all:
            cap = int(charge.limit / units(1))
            counts[charge.budget_id] = (
                rng.randint(0, cap + 2) if cap < 1000 else rng.randint(0, 10**6),
                rng.randint(0, 3),
                rng.randint(0, 2),
            )
        leases = _leases(tuple(limits), counts)
        rate = rated(tuple(limits), window)
        general = rate_headers(windows(leases, tuple(limits), window, None), window, AT)
        assert admitted_headers(leases, rate, AT) == general


def test_the_tightest_limit_of_each_kind_is_shown() -> None:
    """A tenant's 100 requests a minute with 40 used and a key's 50 with 30 used: the key's
    20 left is shown; tokens only the tenant caps; both reset at the minute's end."""
    tenant = _limit("t", 100, 1000, key=False)
    key = _limit("k", 50, None, key=True)
    leases = _leases(
        (tenant, key),
        {
            "rl_t:requests": (35, 4, 1),
            "rl_t:tokens": (600, 0, 0),
            "rl_k:requests": (25, 4, 1),
        },
    )
    headers = admitted_headers(leases, rated((tenant, key), minute(AT)), AT)
    assert headers == {
        "x-ratelimit-limit-requests": "50",
        "x-ratelimit-remaining-requests": "20",
        "x-ratelimit-reset-requests": "18.750s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "400",
        "x-ratelimit-reset-tokens": "18.750s",
    }


def test_a_minute_past_its_cap_shows_none_left_and_no_limit_no_headers() -> None:
    """Tokens counted past the cap (a request in flight may take the minute past it): 0
    remaining, never negative; no limit at all: no header."""
    tokens = _limit("t", None, 100, key=False)
    leases = _leases((tokens,), {"rl_t:tokens": (90, 30, 0)})
    headers = admitted_headers(leases, rated((tokens,), minute(AT)), AT)
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert "x-ratelimit-limit-requests" not in headers
    assert admitted_headers(_leases((), {}), rated((), minute(AT)), AT) == {}
