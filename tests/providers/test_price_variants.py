"""Price entries with 1-hour writes, long-context rates and service tiers; exact costs."""

from decimal import Decimal

import pytest

from gateway.accounting.records import Record
from gateway.usage import Usage
from pricing.book import PriceError, price_from_mapping
from pricing.cost import Cost, compute
from tests.factories import record
from tests.providers.prices import GPT, SONNET

D = Decimal


def test_1h_writes_are_priced_at_their_own_rate() -> None:
    cost = compute(Usage(20, 0, 1500, 60, cache_write_1h_tokens=500), SONNET)
    # 1000 x 3.75 + 500 x 6 = 3750 + 3000 per million
    assert cost == Cost(
        uncached=D("0.000060000"),
        cache_read=D("0E-9"),
        cache_write=D("0.006750000"),
        output=D("0.000900000"),
        uncached_equivalent=D("0.005460000"),
    )
    assert cost.total == D("0.007710000")


def test_long_context_rates_apply_to_the_whole_request_past_the_threshold() -> None:
    at_threshold = compute(Usage(200_000, 0, 0, 0), SONNET)
    past = compute(Usage(150_000, 50_001, 0, 1000), SONNET)
    assert at_threshold.uncached == D("0.600000000")  # 200,000 is not above 200,000
    # 150,000 x 6 + 50,001 x 0.60 + 1000 x 22.50, all at the long-context rates
    assert (past.uncached, past.cache_read, past.output) == (
        D("0.900000000"),
        D("0.030000600"),
        D("0.022500000"),
    )


def test_a_reported_tier_uses_its_rates_and_standard_names_the_base() -> None:
    usage = Usage(2000, 0, 0, 100)
    assert compute(usage, GPT, tier="priority").total == D("0.008400000")  # 7000 + 1400
    assert compute(usage, GPT, tier="flex").total == D("0.002400000")
    assert compute(usage, GPT, tier="default").total == D("0.004800000")
    assert compute(usage, GPT, tier="scale").total == D("0.004800000")  # unlisted: base


def test_variants_are_plain_data_that_load_back_to_the_same_entry() -> None:
    variants = SONNET.variants()
    assert variants == {
        "long_context": {
            "above": 200000,
            "input": "6",
            "cache_read": "0.60",
            "cache_write": "7.50",
            "cache_write_1h": "12",
            "output": "22.50",
        }
    }
    entry = {
        "model": SONNET.model,
        "effective_from": SONNET.effective_from,
        "input": "3",
        "cache_read": "0.30",
        "cache_write": "3.75",
        "cache_write_1h": "6",
        "output": "15",
        **variants,
    }
    assert price_from_mapping(entry) == SONNET
    assert GPT.variants()["tiers"]["flex"] == {"input": "1", "cache_read": "0.25", "output": "4"}  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"long_context": {"above": 0, "input": 1, "cache_read": 1, "output": 1}}, "positive"),
        ({"tiers": {"standard": {"input": 1, "cache_read": 1, "output": 1}}}, "standard tier"),
        ({"tiers": {"batch": {"input": 1, "output": 1}}}, "tiers.batch.cache_read"),
        ({"cache_write_1h": "-1"}, "non-negative"),
    ],
)
def test_bad_variants_are_refused(extra: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(PriceError, match=message):
        price_from_mapping(
            {
                "model": "m",
                "effective_from": "2026-01-01",
                "input": 1,
                "cache_read": 1,
                "output": 1,
                **extra,
            }
        )


def test_records_journal_1h_writes() -> None:
    usage = Usage(20, 0, 1500, 60, cache_write_1h_tokens=500)
    made = record(usage=usage, prices=SONNET, upstream="anthropic/x")
    assert made.cost.cache_write == D("0.006750000")
    assert Record.from_json(made.to_json()) == made
