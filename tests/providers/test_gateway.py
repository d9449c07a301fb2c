"""End to end: the official openai client, a real `kvgate serve`, litellm, an emulated
Anthropic (and OpenAI) on loopback; records and statements checked to the nano-dollar."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from gateway.db.models import RequestRow
from tests.factories import litellm
from tests.providers.prices import GPT, SONNET, SONNET_PRIORITY_CONTRACT
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.e2e
D = Decimal
KEY_ENV = "KVGATE_TEST_ANTHROPIC_KEY"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture
def stack(empty_database_url: str, tmp_path: Path) -> Iterator[Stack]:
    with running_stack(
        tmp_path,
        empty_database_url,
        prices=[SONNET, GPT, SONNET_PRIORITY_CONTRACT],
        tenants=("acme",),
        **{KEY_ENV: "sk-ant-test"},
    ) as stack:
        emulator = stack.start_emulator("--event-delay-s", "0.02")
        anthropic = {"api_base": emulator.url, "api_key_env": KEY_ENV, "price_model": SONNET.model}
        stack.configure(
            [
                litellm("claude", "anthropic/anthropic-cache-write", **anthropic),
                litellm(
                    "claude-retry",
                    "anthropic/anthropic-error-500",
                    **anthropic,
                    fallbacks=[{"litellm_model": "anthropic/anthropic-cache-read", **anthropic}],
                ),
                litellm("claude-long", "anthropic/anthropic-long", **anthropic),
                litellm(
                    "claude-priority",
                    "anthropic/anthropic-priority",
                    **{**anthropic, "price_model": SONNET_PRIORITY_CONTRACT.model},
                ),
                litellm(
                    "gpt",
                    "openai/openai-no-usage",
                    api_base=emulator.url + "/v1",
                    price_model=GPT.model,
                ),
            ]
        )
        stack.start_gateway()
        yield stack


def classes(row: RequestRow) -> tuple[int, int, int, int, int, str]:
    return (
        row.uncached_tokens,
        row.cache_read_tokens,
        row.cache_write_tokens,
        row.cache_write_1h_tokens,
        row.output_tokens,
        row.usage_source,
    )


def test_anthropic_cache_writes_are_recorded_and_billed_at_their_rates(stack: Stack) -> None:
    """20 x 3 + (1000 x 3.75 + 500 x 6) + 60 x 15 per million, streamed and not."""
    client = stack.client()
    reply = client.chat.completions.create(model="claude", messages=MESSAGES)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "Paris is the capital of France."
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (1520, 60)
    extra = reply.usage.model_extra or {}
    assert extra["cost"] == "0.007710000"
    assert extra["usage_source"] == "reported"

    stream = client.chat.completions.create(
        model="claude",
        messages=MESSAGES,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Paris is the capital of France."
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == 1520
    assert (usage.model_extra or {})["cost"] == "0.007710000"

    rows = stack.rows(count=2)
    assert [classes(r) for r in rows] == [(20, 0, 1500, 500, 60, "reported")] * 2
    assert [r.cost_cache_write for r in rows] == [D("0.006750000")] * 2
    assert [r.cost_total for r in rows] == [D("0.007710000")] * 2
    assert {(r.upstream, r.service_tier, r.rate_class, r.price_id, r.stream) for r in rows} == {
        ("anthropic/anthropic-cache-write", "standard", "standard", SONNET.id, False),
        ("anthropic/anthropic-cache-write", "standard", "standard", SONNET.id, True),
    }

    legacy = httpx.post(
        stack.url + "/v1/completions",
        headers={"authorization": f"Bearer {stack.key}"},
        json={"model": "claude", "prompt": "Paris is"},
    )
    assert legacy.status_code == 400 and legacy.json()["error"]["param"] == "model"

    statement = stack.statement()
    [line] = statement["line_items"]
    assert (
        line["model"],
        line["requests"],
        line["uncached_tokens"],
        line["cache_write_tokens"],
        line["output_tokens"],
        line["cost_total"],
    ) == ("claude", 2, 40, 3000, 120, "0.015420000")
    assert statement["totals"]["cost_total"] == "0.015420000"


def test_an_anthropic_priority_tier_stream_is_billed_at_the_tier_rates(stack: Stack) -> None:
    """Anthropic reports the tier in message_start only: 1000 x 3.90 + 50 x 19.50 per
    million (the contract's priority rates), streamed and not, and shown so in the statement."""
    client = stack.client()
    reply = client.chat.completions.create(model="claude-priority", messages=MESSAGES)  # type: ignore[arg-type]
    assert reply.usage is not None
    assert (reply.usage.model_extra or {})["cost"] == "0.004875000"
    stream = client.chat.completions.create(
        model="claude-priority",
        messages=MESSAGES,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.model_extra or {})["cost"] == "0.004875000"

    rows = stack.rows(count=2)
    assert [(r.service_tier, r.rate_class, r.stream, r.cost_total) for r in rows] == [
        ("priority", "priority", False, D("0.004875000")),
        ("priority", "priority", True, D("0.004875000")),
    ]
    [line] = stack.statement()["line_items"]
    assert {k: line[k] for k in ("rate_class", "input_rate", "output_rate", "cost_total")} == {
        "rate_class": "priority",
        "input_rate": "3.900000000",
        "output_rate": "19.500000000",
        "cost_total": "0.009750000",
    }


def test_a_500_fails_over_to_the_next_target_as_a_second_attempt(stack: Stack) -> None:
    """Two attempts, both recorded and counted; one completed interaction."""
    reply = stack.client().chat.completions.create(
        model="claude-retry",
        messages=MESSAGES,  # type: ignore[arg-type]
        extra_headers={"x-interaction-id": "conv-42"},
    )
    assert reply.usage is not None and reply.usage.prompt_tokens == 2050

    rows = stack.rows(count=2)
    assert [(r.attempt, r.status, r.upstream, r.interaction_id) for r in rows] == [
        (1, "failed", "anthropic/anthropic-error-500", "conv-42"),
        (2, "completed", "anthropic/anthropic-cache-read", "conv-42"),
    ]
    assert rows[0].error is not None and "500" in rows[0].error
    assert rows[1].request_id == rows[0].request_id + ".2"
    # 50 x 3 + 2000 x 0.30 (reads at the cache-read rate) + 80 x 15
    assert classes(rows[1]) == (50, 2000, 0, 0, 80, "reported")
    assert [r.cost_total for r in rows] == [D("0E-9"), D("0.001950000")]

    totals = stack.statement()["totals"]
    assert (totals["requests"], totals["completed_interactions"], totals["cost_total"]) == (
        2,
        1,
        "0.001950000",
    )
    assert totals["cost_per_completed_interaction"] == "0.001950000"


def test_an_abandoned_stream_is_recorded_cancelled_with_tokens_so_far(stack: Stack) -> None:
    """The prompt side came in message_start (reported); output is counted, so: estimated."""
    with httpx.stream(
        "POST",
        stack.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {stack.key}"},
        json={"model": "claude-long", "messages": MESSAGES, "stream": True},
    ) as reply:
        seen = 0
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                seen += 1
            if seen == 10:
                break
    [row] = stack.rows(count=1)
    assert row.status == "cancelled" and row.error == "client disconnected"
    assert (row.uncached_tokens, row.cache_read_tokens, row.usage_source) == (40, 1000, "estimated")
    assert 9 <= row.output_tokens < 200  # what had been generated, not the whole answer
    assert row.cost_total == (D(40 * 3) + D(1000) * D("0.30") + D(row.output_tokens * 15)) / 10**6


def test_a_stream_without_usage_is_estimated_not_taken_from_litellm(stack: Stack) -> None:
    stream = stack.client().chat.completions.create(
        model="gpt",
        messages=MESSAGES,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (11, 7)
    assert (usage.model_extra or {})["usage_source"] == "estimated"
    [row] = stack.rows(count=1)
    assert classes(row) == (11, 0, 0, 0, 7, "estimated")
    assert row.cost_total == D("0.000078000")  # 11 x 2 + 7 x 8
