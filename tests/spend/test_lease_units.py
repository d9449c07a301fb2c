"""Lease units (gateway/db/spend.py ``UNITS``): the leases and admission count in ints, and
every figure they give is the one the Decimal arithmetic gave, to the unit and to the
representation: the largest cost (``money``, half-even to the nano), the amounts' round
trip, the slice's share of a limit, and the x-ratelimit-* counts (truncated toward zero).
Random pairs, a fixed seed; no database."""

from __future__ import annotations

import os
import random
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.db.spend import UNITS, Charge, from_units, to_units
from gateway.serving import admission
from gateway.serving.calls import Endpoint
from gateway.serving.leases import SHARE, SPEND_SHARES
from gateway.serving.rates import COUNT, UNIT
from pricing.cost import NANO_TOKENS, money, money_nanos, nano_rate

# 30,000 here (a few seconds); KVGATE_UNIT_PAIRS=300000 for the full comparison.
PAIRS = int(os.environ.get("KVGATE_UNIT_PAIRS", "30000"))


def _rate(rng: random.Random) -> Decimal:
    """A rate per million tokens: mostly like a price book's, some past what ints take."""
    kind = rng.random()
    if kind < 0.6:  # prices as books have them: 0 to 100, to 0-6 decimals
        return Decimal(rng.randint(0, 10 ** rng.randint(1, 8))).scaleb(-rng.randint(0, 6))
    if kind < 0.9:  # long, tiny or huge
        return Decimal(rng.randint(0, 10 ** rng.randint(0, 14))).scaleb(-rng.randint(-8, 14))
    return -Decimal(rng.randint(1, 10**6)).scaleb(-rng.randint(0, 9))  # negative


def _tokens(rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.6:
        return rng.randint(0, 10 ** rng.randint(0, 7))
    if kind < 0.8:
        return rng.choice([0, 1, NANO_TOKENS - 1, -(NANO_TOKENS - 1), 10**20])
    return rng.randint(-(10**16), 10**16)


def test_money_in_nanos_is_money_on_random_pairs() -> None:
    """``money_nanos`` is ``money`` x 10^9 wherever ``nano_rate`` takes the rate and the
    tokens are within ``NANO_TOKENS``; made back into a Decimal, the same digits (a zero's
    sign aside: only a cost above zero is ever a largest cost)."""
    rng = random.Random(18)
    compared = 0
    for _ in range(PAIRS):
        rate, tokens = _rate(rng), _tokens(rng)
        fraction = nano_rate(rate)
        if fraction is None or not -NANO_TOKENS < tokens < NANO_TOKENS:
            continue
        nanos = money_nanos(tokens, fraction)
        expected = money(tokens, rate)
        made = Decimal(nanos).scaleb(-9)
        assert made == expected, (tokens, rate)
        if expected:  # a zero may be -0E-9 (a negative rate): never a largest cost
            assert made.as_tuple() == expected.as_tuple(), (tokens, rate)
        compared += 1
    assert compared > PAIRS // 2


def test_the_largest_cost_in_units_is_the_decimal_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``largest_units`` (ints, ``money`` written out) is ``largest_cost``, to the unit,
    and a charge's amount made from it is the Decimal admission made before, digit for
    digit: for random prices (several models, some no int takes), bodies and caps."""
    rng = random.Random(1818)
    table: dict[str, Any] = {}
    monkeypatch.setattr(
        admission,
        "_dearest",
        lambda book, deployment, at: (None, book, at, at, table["r"], table["n"]),
    )
    ledger: Any = SimpleNamespace(book=None)
    at = datetime(2026, 12, 1, tzinfo=UTC)
    in_ints = 0
    for _ in range(PAIRS):
        rates = tuple((_rate(rng), _rate(rng)) for _ in range(rng.choice([0, 1, 1, 2, 3])))
        table["r"], table["n"] = rates, admission.nano_rates(rates)
        endpoint = rng.choice([Endpoint.CHAT, Endpoint.COMPLETIONS])
        body = {"max_tokens": _tokens(rng), "echo": rng.random() < 0.3}
        call = SimpleNamespace(
            endpoint=endpoint,
            body=body,
            body_bytes=rng.choice([0, _tokens(rng)]),
            prompt_chars=rng.randint(0, 10**6),
        )
        ctx: Any = SimpleNamespace(call=call, deployment=None)
        try:
            old = admission.largest_cost(ledger, ctx, at)
        except ArithmeticError:  # past Decimal's precision: so is the new path
            with pytest.raises(ArithmeticError):
                admission.largest_units(ledger, ctx, at)
            continue
        units = admission.largest_units(ledger, ctx, at)
        assert units == to_units(old)
        in_ints += table["n"] is not None and bool(rates)
        if -(10**18) < old < 10**18:  # Charge.amount, made from the units
            amount = Charge("b", "", at, Decimal(1), None, None, units).amount
            assert amount.as_tuple() == old.as_tuple(), (rates, body, call.body_bytes)
    assert in_ints > PAIRS // 4  # most of them priced in ints


def test_amounts_round_trip_through_units() -> None:
    """Amounts to 11 decimals (money to 9; a limit x 5 % to 11) are whole units, back to
    the same value; money comes back with its own digits (to the nano)."""
    rng = random.Random(7)
    for _ in range(PAIRS):
        places = rng.randint(0, 11)
        amount = Decimal(rng.randint(-(10**18), 10**18)).scaleb(-places)
        assert from_units(to_units(amount)) == amount
        assert to_units(amount) == amount * UNITS
        nano = Decimal(rng.randint(1, 10**18)).scaleb(-9)
        assert from_units(to_units(nano)).as_tuple() == nano.as_tuple()
        limit = Decimal(rng.randint(0, 10**18 - 1)).scaleb(-9)  # as parse_limit takes one
        share = limit * SHARE
        assert from_units(to_units(share)) == share
        # the tick's comparisons, in ints: available < want / 2; spent >= held x 25 %
        held, spent = to_units(limit), to_units(nano)
        assert (spent * SPEND_SHARES >= held) == (nano >= limit / SPEND_SHARES)
        assert (held * 2 < to_units(share)) == (limit < share / 2)
    assert from_units(0).as_tuple() == Decimal(0).as_tuple()


def test_counts_in_units_truncate_as_the_decimal_division() -> None:
    """``admitted_fields``' count of a slice, ``total // COUNT`` toward zero, is
    ``int(total / UNIT)`` of the same total in Decimal, negative totals included."""
    rng = random.Random(11)
    for _ in range(PAIRS):
        total = rng.randint(-(10**17), 10**17)
        if rng.random() < 0.5:
            total -= total % COUNT  # whole counts, as counters hold them
        counted = total // COUNT if total >= 0 else -(-total // COUNT)
        assert counted == int(from_units(total) / UNIT)
