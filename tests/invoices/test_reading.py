"""Provider exports read into bills (gateway.invoices): tokens in kvgate's four classes and
USD exactly, from the fixture files (tests/fixtures/invoices) and from malformed ones."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gateway.invoices.reading import load_bill, read_bill
from gateway.invoices.shapes import UNATTRIBUTED, Billed, InvoiceError, Tokens

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "invoices"
AUG_1, AUG_2, AUG_3 = date(2025, 8, 1), date(2025, 8, 2), date(2025, 8, 3)


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text(), parse_float=Decimal)


def test_openai_usage_counts_cached_tokens_inside_input_and_sums_projects_per_day() -> None:
    bill = load_bill("openai", FIXTURES / "openai_usage.json")
    assert bill.lines == (
        # 3000 + 100 input, 1200 of them cached: 1900 uncached.
        Billed(AUG_1, "gpt-4o-mini-2024-07-18", Tokens(1900, 1200, 0, 410), 3),
        Billed(AUG_2, "gpt-4.1-nano-2025-04-14", Tokens(40, 0, 0, 5), 1),
        Billed(AUG_2, "gpt-4o-2024-08-06", Tokens(520, 0, 0, 50), 1),
    )
    assert (bill.has_usage, bill.has_costs, bill.counts_requests) == (True, False, True)
    assert (bill.first_day, bill.last_day) == (AUG_1, AUG_3)  # the empty bucket counts
    assert bill.warnings == ()


def test_openai_costs_are_exact_usd_per_model_of_the_line_item() -> None:
    bill = load_bill("openai", FIXTURES / "openai_costs.json")
    assert [(line.day, line.model, line.cost) for line in bill.lines] == [
        (AUG_1, "gpt-4o-mini-2024-07-18", Decimal("0.000621")),
        (AUG_2, "gpt-4.1-nano-2025-04-14", Decimal("0.000006")),
        (AUG_2, "gpt-4o-2024-08-06", Decimal("0.0018")),
        (AUG_2, "web search tool calls", Decimal("0.01")),  # no model: its own name
    ]
    assert all(line.tokens == Tokens() for line in bill.lines)
    assert (bill.has_usage, bill.has_costs) == (False, True)


def test_openai_reads_both_reports_as_an_object_or_a_list_of_pages() -> None:
    usage, costs = fixture("openai_usage.json"), fixture("openai_costs.json")
    together = read_bill("openai", {"usage": usage, "costs": costs})
    assert read_bill("openai", [usage, costs]) == together
    assert read_bill("openai", {"usage": [usage], "costs": [costs]}) == together
    assert together.lines[0] == Billed(
        AUG_1, "gpt-4o-mini-2024-07-18", Tokens(1900, 1200, 0, 410), 3, Decimal("0.000621")
    )
    assert (together.has_usage, together.has_costs) == (True, True)


def test_openai_audio_tokens_are_added_to_input_and_output() -> None:
    page = {
        "data": [
            {
                "start_time": 1754006400,
                "results": [
                    {
                        "model": "gpt-4o-audio-preview",
                        "input_tokens": 100,
                        "input_cached_tokens": 30,
                        "input_audio_tokens": 7,
                        "output_tokens": 11,
                        "output_audio_tokens": 5,
                        "surprise": {"ignored": True},
                    }
                ],
            }
        ]
    }
    [line] = read_bill("openai", page).lines
    assert line.tokens == Tokens(77, 30, 0, 16)
    assert line.requests == 0  # missing: zero


def test_anthropic_usage_keeps_its_disjoint_classes_and_sums_both_cache_writes() -> None:
    bill = load_bill("anthropic", FIXTURES / "anthropic_usage.json")
    assert bill.lines == (
        Billed(AUG_1, "claude-sonnet-4-5-20250929", Tokens(500, 5000, 1000, 320)),
        Billed(AUG_2, "claude-3-5-haiku-20241022", Tokens(1000, 0, 0, 100)),
    )
    assert (bill.has_usage, bill.has_costs, bill.counts_requests) == (True, False, False)
    assert (bill.first_day, bill.last_day) == (AUG_1, AUG_2)


def test_anthropic_cost_amounts_are_cents_as_decimal_strings() -> None:
    bill = load_bill("anthropic", FIXTURES / "anthropic_costs.json")
    assert [(line.day, line.model, line.cost) for line in bill.lines] == [
        (AUG_1, "claude-sonnet-4-5-20250929", Decimal("0.01155")),  # 1.155 cents
        (AUG_2, UNATTRIBUTED, Decimal("0.01")),  # web search: no model
        (AUG_2, "claude-3-5-haiku-20241022", Decimal("0.0012")),
    ]


def test_anthropic_one_hour_writes_and_hourly_buckets_fold_into_the_utc_day() -> None:
    page = {
        "data": [
            {
                "starting_at": "2025-08-01T23:00:00+00:00",
                "results": [
                    {
                        "model": "claude-opus-4-1-20250805",
                        "uncached_input_tokens": 1,
                        "cache_creation": {"ephemeral_1h_input_tokens": 4},
                        "output_tokens": 2,
                    }
                ],
            },
            {
                # 02:00 in UTC+03:00 is 23:00 UTC the day before.
                "starting_at": "2025-08-02T02:00:00+03:00",
                "results": [
                    {
                        "model": "claude-opus-4-1-20250805",
                        "cache_read_input_tokens": 8,
                        "cache_creation": None,
                    }
                ],
            },
        ],
        "has_more": True,
        "next_page": "page_2",
    }
    bill = read_bill("anthropic", page)
    assert bill.lines == (Billed(AUG_1, "claude-opus-4-1-20250805", Tokens(1, 8, 4, 2)),)
    assert bill.warnings == (
        "page says has_more: the export may be incomplete (fetch next_page 'page_2' too)",
    )


@pytest.mark.parametrize(
    ("provider", "document", "message"),
    [
        ("openai", "hello", "an OpenAI export is a page"),
        ("openai", {"rows": []}, "this object has none of data, usage, costs"),
        ("openai", {"data": {"a": 1}}, "page.data must be a JSON array, not an object"),
        ("openai", {"data": [{"results": []}]}, "page.data[0].start_time must be a Unix time"),
        (
            "openai",
            {
                "usage": {
                    "data": [{"start_time": 1, "results": [{"model": "m", "input_tokens": -1}]}]
                }
            },
            "usage.data[0].results[0].input_tokens must be a non-negative whole number, not -1",
        ),
        (
            "openai",
            {"data": [{"start_time": 1, "results": [{"input_tokens": 5}]}]},
            "page.data[0].results[0] names no model: export usage with group_by=model",
        ),
        (
            "openai",
            [
                {
                    "data": [
                        {
                            "start_time": 1,
                            "results": [
                                {"model": "m", "input_tokens": 1, "input_cached_tokens": 2}
                            ],
                        }
                    ]
                }
            ],
            "[0].data[0].results[0]: input_cached_tokens (2) is part of input_tokens (1)",
        ),
        (
            "openai",
            {
                "data": [
                    {
                        "start_time": 1,
                        "results": [
                            {
                                "object": "organization.costs.result",
                                "amount": {"value": 1, "currency": "eur"},
                            }
                        ],
                    }
                ]
            },
            "page.data[0].results[0].amount.currency is 'eur': kvgate reads USD only",
        ),
        (
            "openai",
            {"data": [{"start_time": 1, "results": [{"object": "list"}]}]},
            "page.data[0].results[0].object is 'list': neither a usage nor a costs result",
        ),
        (
            "anthropic",
            {"data": [{"starting_at": "yesterday", "results": []}]},
            "page.data[0].starting_at must be an RFC 3339 moment, not 'yesterday'",
        ),
        (
            "anthropic",
            {
                "costs": {
                    "data": [
                        {
                            "starting_at": "2025-08-01T00:00:00Z",
                            "results": [{"amount": "lots", "model": "claude"}],
                        }
                    ]
                }
            },
            "costs.data[0].results[0].amount must be a number or a decimal string, not 'lots'",
        ),
        ("anthropic", {"data": [7]}, "page.data[0] must be a JSON object, not int 7"),
        ("bedrock", {"data": []}, "provider must be one of openai, anthropic, not 'bedrock'"),
    ],
)
def test_a_malformed_export_is_an_error_naming_what_is_wrong(
    provider: str, document: Any, message: str
) -> None:
    with pytest.raises(InvoiceError) as raised:
        read_bill(provider, document)
    assert message in str(raised.value)


def test_a_file_that_is_not_json_is_an_error_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "usage.json"
    broken.write_text('{"data": [')
    with pytest.raises(InvoiceError, match=r"usage\.json: not JSON"):
        load_bill("openai", broken)
    with pytest.raises(InvoiceError, match=r"missing\.json: No such file"):
        load_bill("openai", tmp_path / "missing.json")
