"""Costs from usage: Decimal to the nano-dollar per token class and request, as kvgate bills."""

from __future__ import annotations

from decimal import Decimal

from gateway.tools.cachetest.client import Outcome
from gateway.tools.cachetest.costs import change, input_cost, spend, statement_price
from gateway.tools.totals import StatementTotals
from pricing.book import Rates

PRICE = Rates(input=Decimal("0.20"), cache_read=Decimal("0.05"), output=Decimal("0.60"))


def test_input_cost_prices_uncached_and_cached_tokens_at_their_rates() -> None:
    # 1,026 prompt tokens, 1,024 cached: 2 x 0.20/1M + 1,024 x 0.05/1M.
    outcome = Outcome(200, 1026, 1024, 4, 0.01, 0.02)
    assert input_cost(outcome, PRICE) == Decimal("0.000000400") + Decimal("0.000051200")


def test_a_spend_sums_tokens_and_money_and_counts_failures_in_the_cost() -> None:
    cold = Outcome(200, 1026, 0, 4, 0.03, 0.04)
    warm = Outcome(200, 1026, 1024, 4, 0.01, 0.02)
    failed = Outcome(503, 0, 0, 0, None, 0.001, "overloaded")
    s = spend([cold, warm, failed], PRICE)
    assert (s.requests, s.completed, s.prompt_tokens, s.cached_tokens) == (3, 2, 2052, 1024)
    assert s.input_cost == Decimal("0.000205200") + Decimal("0.000051600")
    assert s.uncached_input_cost == Decimal("0.000410400")
    assert s.output_cost == Decimal("0.000004800")
    # (0.000256800 + 0.000004800) / 2 completed.
    assert s.cost_per_completed == Decimal("0.000130800")
    assert s.uncached_cost_per_completed == Decimal("0.000207600")
    assert s.token_hit_rate == 1024 / 2052


def test_without_a_price_there_are_tokens_but_no_money() -> None:
    s = spend([Outcome(200, 10, 0, 1, 0.01, 0.01)], None)
    assert (s.input_cost, s.cost_per_completed, s.prompt_tokens) == (None, None, 10)


def test_the_price_is_read_from_kvgate_statement_line_items() -> None:
    document = {
        "line_items": [
            {"model": "other", "input_rate": "9", "cache_read_rate": "9", "output_rate": "9"},
            {
                "model": "m",
                "input_rate": "0.200000000",
                "cache_read_rate": "0.050000000",
                "output_rate": "0.600000000",
            },
            {"model": "m", "input_rate": None, "cache_read_rate": None, "output_rate": None},
        ]
    }
    price = statement_price(document, "m")
    assert price == PRICE
    assert price is not None and (str(price.input), str(price.cache_read)) == ("0.2", "0.05")
    assert statement_price(document, "absent") is None


def test_billed_is_the_difference_of_two_statements() -> None:
    zero = {
        "requests": 2,
        "uncached_tokens": 10,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "output_tokens": 2,
        "cost_uncached": "0.000002000",
        "cost_cache_read": "0.000000000",
        "cost_cache_write": "0.000000000",
        "cost_total": "0.000003200",
    }
    later = {
        **zero,
        "requests": 4,
        "uncached_tokens": 12,
        "cache_read_tokens": 1024,
        "output_tokens": 10,
        "cost_uncached": "0.000002400",
        "cost_cache_read": "0.000051200",
        "cost_total": "0.000058400",
    }
    billed = StatementTotals.of({"totals": later}).minus(StatementTotals.of({"totals": zero}))
    assert billed == StatementTotals(
        2, 2, 1024, 0, 8, Decimal("0.000051600"), Decimal("0.000055200")
    )
    assert billed.prompt_tokens == 1026 and billed.token_hit_rate == 1024 / 1026


def test_change_is_relative_and_undefined_from_zero() -> None:
    assert change(Decimal("0.000410400"), Decimal("0.000256800")) == -0.3742690058479532
    assert change(0.03, 0.0075) == -0.75
    assert change(0, 1) is None and change(None, 1) is None
