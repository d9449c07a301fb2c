"""A bill against kvgate's records (gateway.invoices.compare): which records a provider
billed, how its model ids fold into kvgate's, and the variance, exactly."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from gateway.invoices.compare import (
    Recorded,
    Side,
    Variance,
    compare,
    folded,
    provider_model,
    variance,
)
from gateway.invoices.shapes import Bill, Billed, Tokens

AUG_1, AUG_2 = date(2025, 8, 1), date(2025, 8, 2)


@pytest.mark.parametrize(
    ("provider", "upstream", "model"),
    [
        ("openai", "openai/gpt-4o-mini", "gpt-4o-mini"),
        ("openai", "gpt-4o-mini", "gpt-4o-mini"),
        ("openai", "o3-mini", "o3-mini"),
        ("openai", "anthropic/claude-sonnet-4-5", None),
        ("openai", "azure/gpt-4o", None),  # Azure bills it, not OpenAI
        ("openai", "http://10.0.0.5:8000", None),  # a vLLM replica
        ("openai", "llama-3", None),
        ("anthropic", "anthropic/claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("anthropic", "claude-3-5-haiku-latest", "claude-3-5-haiku-latest"),
        ("anthropic", "bedrock/anthropic.claude-3-haiku", None),
        ("anthropic", "openai/gpt-4o", None),
    ],
)
def test_only_records_sent_to_the_providers_hosted_api_count(
    provider: str, upstream: str, model: str | None
) -> None:
    assert provider_model(provider, upstream) == model


@pytest.mark.parametrize(
    ("billed", "recorded", "into"),
    [
        ("gpt-4o-mini-2024-07-18", {"gpt-4o-mini", "gpt-4o"}, "gpt-4o-mini"),
        ("gpt-4o-2024-08-06", {"gpt-4o-mini", "gpt-4o"}, "gpt-4o"),
        (
            "gpt-4o-mini-2024-07-18",
            {"gpt-4o-mini-2024-07-18", "gpt-4o-mini"},
            "gpt-4o-mini-2024-07-18",
        ),
        ("claude-sonnet-4-5-20250929", {"claude-sonnet-4-5"}, "claude-sonnet-4-5"),
        ("claude-3-5-haiku-20241022", {"claude-3-5-haiku-latest"}, "claude-3-5-haiku-latest"),
        ("gpt-4o-mini-tts", {"gpt-4o-mini"}, "gpt-4o-mini-tts"),  # not a snapshot date
        ("gpt-4.1-nano-2025-04-14", {"gpt-4o-mini"}, "gpt-4.1-nano-2025-04-14"),
    ],
)
def test_a_dated_snapshot_folds_into_the_alias_kvgate_recorded(
    billed: str, recorded: set[str], into: str
) -> None:
    assert folded(billed, recorded) == into


def test_variance_is_kvgate_minus_provider_and_a_percentage_of_the_providers() -> None:
    assert variance(1800, 1900) == Variance(-100, Decimal("-5.26"))
    assert variance(Decimal("0.0006"), Decimal("0.000621")) == Variance(
        Decimal("-0.000021"), Decimal("-3.38")
    )
    assert variance(5, 0) == Variance(5, None)  # no percentage of nothing
    assert variance(0, 0) == Variance(0, None)
    assert variance(7, None) is None  # the provider's export had no such report


def test_days_and_models_either_side_lacks_show_the_other_side_zero() -> None:
    bill = Bill(
        "openai",
        (
            Billed(
                AUG_1, "gpt-4o-mini-2024-07-18", Tokens(1900, 1200, 0, 410), 3, Decimal("0.000621")
            ),
            Billed(AUG_2, "gpt-4.1-nano-2025-04-14", Tokens(40, 0, 0, 5), 1, Decimal("0.000006")),
        ),
        has_usage=True,
        has_costs=True,
        counts_requests=True,
    )
    recorded = [
        Recorded(AUG_1, "openai/gpt-4o-mini", 2, Tokens(1800, 1200, 0, 400), Decimal("0.0006")),
        Recorded(AUG_2, "gpt-4o-mini", 1, Tokens(100, 0, 0, 10), Decimal("0.000021")),
        Recorded(AUG_1, "anthropic/claude-sonnet-4-5", 9, Tokens(9, 9, 9, 9), Decimal("9")),
    ]
    rows = compare(bill, recorded)
    assert [(r.day, r.model, r.provider_models, r.kvgate, r.provider) for r in rows] == [
        (
            AUG_1,
            "gpt-4o-mini",
            ("gpt-4o-mini-2024-07-18",),
            Side(2, Tokens(1800, 1200, 0, 400), Decimal("0.0006")),
            Side(3, Tokens(1900, 1200, 0, 410), Decimal("0.000621")),
        ),
        (
            AUG_2,
            "gpt-4.1-nano-2025-04-14",
            ("gpt-4.1-nano-2025-04-14",),
            Side(0, Tokens(), Decimal(0)),
            Side(1, Tokens(40, 0, 0, 5), Decimal("0.000006")),
        ),
        (
            AUG_2,
            "gpt-4o-mini",
            (),
            Side(1, Tokens(100, 0, 0, 10), Decimal("0.000021")),
            Side(0, Tokens(), Decimal(0)),
        ),
    ]
    first = rows[0]
    assert first.token_variance() == {
        "uncached": Variance(-100, Decimal("-5.26")),
        "cache_read": Variance(0, Decimal("0.00")),
        "cache_write": Variance(0, None),
        "output": Variance(-10, Decimal("-2.44")),
    }
    assert first.cost_variance() == Variance(Decimal("-0.000021"), Decimal("-3.38"))
    assert [r.apart() for r in rows] == [True, True, True]
    assert [r.day for r in compare(bill, recorded, since=AUG_2)] == [AUG_2, AUG_2]
    assert [r.day for r in compare(bill, recorded, until=AUG_1)] == [AUG_1]


def test_a_report_the_file_lacked_is_no_figure_rather_than_zero() -> None:
    bill = Bill(
        "anthropic",
        (Billed(AUG_1, "claude-sonnet-4-5-20250929", Tokens(500, 5000, 1000, 320)),),
        has_usage=True,
        has_costs=False,
        counts_requests=False,
    )
    recorded = [
        Recorded(
            AUG_1,
            "anthropic/claude-sonnet-4-5",
            2,
            Tokens(500, 5000, 1000, 300),
            Decimal("0.01125"),
        )
    ]
    [row] = compare(bill, recorded)
    assert row.provider == Side(None, Tokens(500, 5000, 1000, 320), None)
    assert row.cost_variance() is None
    assert row.token_variance()["output"] == Variance(-20, Decimal("-6.25"))
    assert row.apart()
