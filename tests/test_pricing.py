"""The dated price book and exact Decimal cost."""

from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.usage import Usage
from pricing.book import (
    Price,
    PriceBook,
    PriceError,
    load_catalog,
    parse_moment,
    price_from_mapping,
)
from pricing.cost import Cost, compute, money

D = Decimal


def price(model: str = "m", when: str = "2026-01-01", **rates: str) -> Price:
    entry = {
        "model": model,
        "effective_from": when,
        "input": "0.15",
        "cache_read": "0.015",
        "output": "0.45",
        **rates,
    }
    return price_from_mapping(entry)


def at(text: str) -> datetime:
    return parse_moment(text)


def test_the_entry_in_force_is_the_latest_not_after_the_moment() -> None:
    book = PriceBook([price(when="2026-01-01", input="1"), price(when="2026-07-01", input="2")])
    assert book.price_for("m", at=at("2025-12-31T23:59:59")) is None
    assert book.price_for("m", at=at("2026-01-01")).input == D("1")  # type: ignore[union-attr]
    assert book.price_for("m", at=at("2026-06-30T23:59:59.999")).input == D("1")  # type: ignore[union-attr]
    assert book.price_for("m", at=at("2026-07-01T00:00:00")).input == D("2")  # type: ignore[union-attr]
    assert book.price_for("other", at=at("2026-08-01")) is None


def test_times_with_zones_compare_in_utc() -> None:
    book = PriceBook([price(when="2026-07-01T00:00:00+02:00", input="2"), price(when="2026-01-01")])
    # 2026-06-30T22:30Z is after 2026-07-01T00:00+02:00 (= 2026-06-30T22:00Z).
    assert book.price_for("m", at=at("2026-06-30T22:30:00Z")).input == D("2")  # type: ignore[union-attr]
    assert book.price_for("m", at=at("2026-06-30T21:59:00Z")).input == D("0.15")  # type: ignore[union-attr]


def test_price_id_is_stable_and_utc() -> None:
    assert price(when="2026-07-01T02:00:00+02:00").id == "m@2026-07-01T00:00:00Z"


@pytest.mark.parametrize("rate", ["1000000000", "1e999", "99999999999"])
def test_a_rate_the_money_columns_cannot_hold_is_refused(rate: str) -> None:
    with pytest.raises(PriceError, match=r"input: must be under 1000000000 per million tokens"):
        price(input=rate)


@pytest.mark.parametrize("currency", ["", "usd", "US", "US DOLLAR", 840])
def test_a_currency_that_is_not_an_iso_code_is_refused(currency: object) -> None:
    with pytest.raises(PriceError, match=r"currency: an ISO 4217 code such as USD is required"):
        price(currency=currency)  # type: ignore[arg-type]


def test_two_different_prices_for_the_same_moment_are_refused() -> None:
    with pytest.raises(PriceError):
        PriceBook([price(input="1"), price(input="2")])


@pytest.mark.parametrize(
    "bad",
    [
        {"input": "-1"},
        {"input": "abc"},
        {"input": "NaN"},
        {"output": None},
        {"effective_from": "yesterday"},
        {"model": ""},
        {"surprise": "1"},
    ],
)
def test_invalid_entries_are_refused(bad: dict[str, object]) -> None:
    entry = {
        "model": "m",
        "effective_from": "2026-01-01",
        "input": "1",
        "cache_read": "0.1",
        "output": "2",
        **bad,
    }
    with pytest.raises(PriceError):
        price_from_mapping(entry)


def test_yaml_floats_become_exact_decimals() -> None:
    assert price_from_mapping(
        {
            "model": "m",
            "effective_from": "2026-01-01",
            "input": 0.1,
            "cache_read": 0.01,
            "output": 0.3,
        }
    ).input == D("0.1")


def test_the_shipped_catalog_validates() -> None:
    prices = load_catalog()
    assert any(p.model == "kvgate/demo-llama-8b" for p in prices)
    assert len(PriceBook(prices)) == len(prices)


def test_catalog_errors_name_the_file_and_entry(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("prices:\n  - model: m\n    effective_from: 2026-01-01\n")
    with pytest.raises(PriceError, match=r"bad\.yaml entry 1"):
        load_catalog(tmp_path)


def test_cost_per_class_is_exact() -> None:
    usage = Usage(uncached_tokens=1000, cache_read_tokens=3000, output_tokens=500)
    cost = compute(usage, price())
    assert cost == Cost(
        uncached=D("0.000150000"),
        cache_read=D("0.000045000"),
        cache_write=D("0.000000000"),
        output=D("0.000225000"),
        uncached_equivalent=D("0.000825000"),
    )
    assert cost.total == D("0.000420000")
    assert cost.saved == D("0.000405000")


def test_cache_writes_use_their_rate_or_the_input_rate() -> None:
    usage = Usage(cache_write_tokens=2000)
    assert compute(usage, price(cache_write="0.1875")).cache_write == D("0.000375000")
    assert compute(usage, price()).cache_write == D("0.000300000")


def test_money_rounds_half_even_at_the_nano_dollar() -> None:
    assert money(1, D("0.0005")) == D("0.000000000")  # 0.5 nano -> 0 (even)
    assert money(3, D("0.0005")) == D("0.000000002")  # 1.5 nano -> 2 (even)
    assert money(7, D("0.0005")) == D("0.000000004")  # 3.5 nano -> 4 (even)
    assert money(1_234_567, D("3")) == D("3.703701000")


def test_total_is_the_exact_sum_of_classes() -> None:
    usage = Usage(
        uncached_tokens=333, cache_read_tokens=777, cache_write_tokens=11, output_tokens=999
    )
    cost = compute(
        usage, price(input="0.333333", cache_read="0.033333", cache_write="0.41", output="1.111111")
    )
    assert cost.total == cost.uncached + cost.cache_read + cost.cache_write + cost.output
    # 333 × 0.333333 / 1e6 = 0.000110999889; 777 × 0.033333 / 1e6 = 0.000025899741;
    # 11 × 0.41 / 1e6 = 0.00000451; 999 × 1.111111 / 1e6 = 0.001109999889
    assert cost.uncached == D("0.000111000")
    assert cost.cache_read == D("0.000025900")
    assert cost.cache_write == D("0.000004510")
    assert cost.output == D("0.001110000")
    assert cost.total == D("0.001251410")
