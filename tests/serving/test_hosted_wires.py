"""Hosted models on their providers' own wires, in-process: the official ``openai`` and
``anthropic`` clients → the gateway → tests/providers' emulator of OpenAI and Anthropic,
each answering from a recorded fixture in the provider's exact wire format.

The bodies go untranslated (the emulator receives what the client sent, with the target's
model name), the answers come back with the billed usage and ``usage.cost``, and the
records are exact. Rates (USD per million tokens): Sonnet 3 input, 0.30 cache read, 3.75
5-minute write, 6 one-hour write, 15 output; GPT-4.1 2 / 0.50 / 8; text-embedding-3-small
0.02 input.

    Messages   30 × 3 + 2,000 × 0.30 + 200 × 3.75 + 1,000 × 6 + 40 × 15 = 8,040 micro-dollars
    Responses  180 × 2 + 1,920 × 0.50 + 7 × 8 = 1,376 micro-dollars
    Embeddings 1,234 × 0.02 = 24.68 micro-dollars
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import orjson
import pytest

from gateway.db.models import RequestRow
from tests.factories import litellm
from tests.providers.emulator import FIXTURES, Emulator, events
from tests.providers.prices import EMBEDDING_SMALL, GPT, SONNET
from tests.serving.conftest import D, Harness
from tests.support.inprocess import Gateway

ANTHROPIC_KEY, OPENAI_KEY = "sk-ant-test", "sk-openai-test"
MESSAGES_COST, RESPONSES_COST, EMBEDDINGS_COST = "0.008040000", "0.001376000", "0.000024680"
SYSTEM = [
    {
        "type": "text",
        "text": "You are terse. " * 40,
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
    }
]
ASKED: dict[str, Any] = {
    "model": "claude",
    "max_tokens": 64,
    "system": SYSTEM,
    "messages": [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "What is the capital of France?",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        }
    ],
}
TEXT = "Paris is the capital of France."


@dataclass
class Hosted:
    emulator: Emulator
    gateway: Gateway
    key: str

    def openai(self) -> openai.AsyncOpenAI:
        return self.gateway.client(self.key)

    def anthropic(self) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=self.gateway.url, api_key=self.key, max_retries=0)

    async def row(self, request_id: str) -> RequestRow:
        [row] = await self.gateway.attempts(request_id)
        return row


@pytest.fixture
async def hosted(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hosted]:
    monkeypatch.setenv("KVGATE_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("KVGATE_TEST_OPENAI_KEY", OPENAI_KEY)
    emulator = Emulator(event_delay_s=0.01)  # so that a client can leave a stream half way
    url = await harness.serve(emulator.app())
    harness.add_prices(SONNET, GPT, EMBEDDING_SMALL)
    claude = {
        "api_base": url,
        "api_key_env": "KVGATE_TEST_ANTHROPIC_KEY",
        "price_model": "claude-sonnet-4-5",
    }
    gpt = {"api_base": url + "/v1", "api_key_env": "KVGATE_TEST_OPENAI_KEY"}
    gateway = await harness.gateway(
        litellm("claude", "anthropic/anthropic-cache-mixed", **claude),
        litellm(
            "claude-retry",
            "anthropic/anthropic-error-500",
            **claude,
            fallbacks=[{"litellm_model": "anthropic/anthropic-cache-mixed", **claude}],
        ),
        litellm("gpt", "openai/openai-responses-cached", **gpt, price_model=GPT.model),
        litellm(
            "gpt-retry",
            "openai/openai-error-429",
            **gpt,
            price_model=GPT.model,
            fallbacks=[
                {"litellm_model": "openai/openai-responses-cached", **gpt, "price_model": GPT.model}
            ],
        ),
        litellm("embed", "openai/openai-embedding", **gpt, price_model=EMBEDDING_SMALL.model),
    )
    yield Hosted(emulator, gateway, harness.tenant.key)


def classes(row: RequestRow) -> tuple[int, int, int, int, int, str]:
    return (
        row.uncached_tokens,
        row.cache_read_tokens,
        row.cache_write_tokens,
        row.cache_write_1h_tokens,
        row.output_tokens,
        row.usage_source,
    )


def extra(value: Any, name: str) -> Any:
    """A member the gateway adds to the SDK's usage model (kept as an extra)."""
    return (value.model_extra or {})[name]


# -- /v1/embeddings ----------------------------------------------------------------------


async def test_hosted_embeddings_are_billed_at_the_input_rate(hosted: Hosted) -> None:
    """1,234 × 0.02 per million: 24.68 micro-dollars, to the nano-dollar."""
    asked = {"input": ["one sentence", "another"], "dimensions": 8, "encoding_format": "float"}
    raw = await hosted.openai().embeddings.with_raw_response.create(model="embed", **asked)  # type: ignore[arg-type]
    reply = raw.parse()
    fixture = orjson.loads((FIXTURES / "openai-embedding.json").read_bytes())
    assert [d.embedding for d in reply.data] == [d["embedding"] for d in fixture["data"]]
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (1234, 1234)
    assert extra(reply.usage, "cost") == EMBEDDINGS_COST
    assert raw.headers["x-kvgate-cost"] == EMBEDDINGS_COST
    row = await hosted.row(raw.headers["x-request-id"])
    assert (row.endpoint, row.upstream, classes(row)) == (
        "/v1/embeddings",
        "openai/openai-embedding",
        (1234, 0, 0, 0, 0, "reported"),
    )
    assert row.cost_total == D(EMBEDDINGS_COST)
    [received] = hosted.emulator.requests
    assert received.path == "/v1/embeddings"
    assert received.body == {**asked, "model": "openai-embedding"}
    assert received.headers["Authorization"] == f"Bearer {OPENAI_KEY}"


# -- /v1/messages, /v1/messages/count_tokens ---------------------------------------------


async def test_hosted_messages_go_untranslated_and_bill_reads_and_one_hour_writes(
    hosted: Hosted,
) -> None:
    """Anthropic's usage (reads, 5m and 1h writes on top of input) billed at each rate;
    the body as the client sent it, cache_control intact; the provider's key, the
    client's anthropic-version and betas."""
    client = hosted.anthropic()
    beta = {"anthropic-beta": "extended-cache-ttl-2025-04-11"}
    raw = await client.messages.with_raw_response.create(**ASKED, extra_headers=beta)
    reply = await raw.parse()
    assert reply.content[0].text == TEXT
    usage = reply.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (
        30,
        2000,
        40,
    )
    assert usage.cache_creation_input_tokens == 1200
    assert usage.cache_creation is not None
    assert (
        usage.cache_creation.ephemeral_5m_input_tokens,
        usage.cache_creation.ephemeral_1h_input_tokens,
    ) == (200, 1000)
    assert extra(usage, "cost") == MESSAGES_COST
    row = await hosted.row(raw.headers["x-request-id"])
    assert (row.endpoint, row.service_tier, row.stream, classes(row)) == (
        "/v1/messages",
        "standard",
        False,
        (30, 2000, 1200, 1000, 40, "reported"),
    )
    assert (row.cost_cache_read, row.cost_cache_write, row.cost_total) == (
        D("0.000600000"),
        D("0.006750000"),
        D(MESSAGES_COST),
    )
    [received] = hosted.emulator.requests
    assert received.path == "/v1/messages"
    assert received.body == {**ASKED, "model": "anthropic-cache-mixed"}
    assert received.headers["x-api-key"] == ANTHROPIC_KEY
    sent = raw.http_request.headers
    assert received.headers["anthropic-version"] == sent["anthropic-version"]
    assert received.headers["anthropic-beta"] == beta["anthropic-beta"]
    assert "Authorization" not in received.headers  # the tenant's key stays here


async def test_a_hosted_messages_stream_relays_the_events_and_bills_message_delta(
    hosted: Hosted,
) -> None:
    client = hosted.anthropic()
    stream = await client.messages.create(**ASKED, stream=True)
    request_id = stream.response.headers["x-request-id"]
    seen = [event async for event in stream]
    assert [e.type for e in seen] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 7,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(e.delta.text for e in seen if e.type == "content_block_delta") == TEXT
    usage = seen[-2].usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (
        30,
        2000,
        40,
    )
    assert usage.cache_creation_input_tokens == 1200
    assert extra(usage, "cost") == MESSAGES_COST
    row = await hosted.row(request_id)
    assert (row.endpoint, row.stream, classes(row)) == (
        "/v1/messages",
        True,
        (30, 2000, 1200, 1000, 40, "reported"),
    )
    assert row.first_token_at is not None and row.cost_total == D(MESSAGES_COST)
    [received] = hosted.emulator.requests
    assert received.body == {**ASKED, "model": "anthropic-cache-mixed", "stream": True}


async def test_a_hosted_messages_stream_passes_the_providers_events_byte_for_byte(
    hosted: Hosted,
) -> None:
    """Every event before the held message_delta is the provider's own bytes (ping too)."""
    recorded = events((FIXTURES / "anthropic-cache-mixed.sse").read_text())
    async with (
        hosted.gateway.http(hosted.key) as http,
        http.stream("POST", "/v1/messages", json={**ASKED, "stream": True}) as reply,
    ):
        body = b"".join([chunk async for chunk in reply.aiter_bytes()])
    sent = [e.decode() for e in body.split(b"\n\n") if e]
    assert [e + "\n\n" for e in sent[:-2]] == recorded[:-2]
    delta = orjson.loads(sent[-2].partition("data: ")[2])
    assert delta["usage"]["cost"] == MESSAGES_COST and sent[-1].startswith("event: message_stop")


async def test_a_failing_anthropic_target_fails_over_on_the_messages_wire(hosted: Hosted) -> None:
    client = hosted.anthropic()
    raw = await client.messages.with_raw_response.create(**{**ASKED, "model": "claude-retry"})
    assert extra((await raw.parse()).usage, "cost") == MESSAGES_COST
    rid = raw.headers["x-request-id"]
    rows = await hosted.gateway.attempts(rid)
    assert [(r.attempt, r.status, r.upstream, r.cost_total) for r in rows] == [
        (1, "failed", "anthropic/anthropic-error-500", D("0E-9")),
        (2, "completed", "anthropic/anthropic-cache-mixed", D(MESSAGES_COST)),
    ]
    assert (
        rows[0].error
        == "anthropic/anthropic-error-500: provider answered 500: Internal server error"
    )
    assert [r.body["model"] for r in hosted.emulator.requests] == [
        "anthropic-error-500",
        "anthropic-cache-mixed",
    ]


async def test_a_client_that_leaves_a_hosted_messages_stream_is_charged_its_cache_writes(
    hosted: Hosted,
) -> None:
    """message_start reported the input (reads, 5m and 1h writes): kept as reported; the
    output is what was relayed, so the record says estimated."""
    async with (
        hosted.gateway.http(hosted.key) as http,
        http.stream("POST", "/v1/messages", json={**ASKED, "stream": True}) as reply,
    ):
        request_id = reply.headers["x-request-id"]
        deltas = 0
        async for line in reply.aiter_lines():
            deltas += line.startswith("event: content_block_delta")
            if deltas == 3:
                break
    [row] = await hosted.gateway.attempts(request_id, count=1)
    assert (row.status, row.error) == ("cancelled", "client disconnected")
    assert classes(row)[:4] == (30, 2000, 1200, 1000) and row.usage_source == "estimated"
    assert 3 <= row.output_tokens < 40
    # 30 × 3 + 2,000 × 0.30 + 200 × 3.75 + 1,000 × 6 per million, and the output so far
    assert row.cost_total == D("0.007440000") + D(row.output_tokens * 15) / 10**6


async def test_hosted_count_tokens_is_forwarded_and_not_billed(hosted: Hosted) -> None:
    asked = {k: ASKED[k] for k in ("model", "system", "messages")}
    raw = await hosted.anthropic().messages.with_raw_response.count_tokens(**asked)
    assert (await raw.parse()).input_tokens == 3230
    assert "x-kvgate-cost" not in raw.headers
    assert await hosted.gateway.attempts(raw.headers["x-request-id"]) == []
    [received] = hosted.emulator.requests
    assert received.path == "/v1/messages/count_tokens"
    assert received.body == {**asked, "model": "anthropic-cache-mixed"}
    assert received.headers["x-api-key"] == ANTHROPIC_KEY


# -- /v1/responses -------------------------------------------------------------------------


async def test_hosted_responses_bill_cached_input_and_leave_kvgate_members_here(
    hosted: Hosted,
) -> None:
    """The interaction id in metadata is kvgate's: recorded, not sent on; the rest goes."""
    raw = await hosted.openai().responses.with_raw_response.create(
        model="gpt",
        instructions="You are terse.",
        input="What is the capital of France?",
        metadata={"interaction_id": "conv-7", "team": "search"},
    )
    reply = raw.parse()
    assert reply.output_text == TEXT
    usage = reply.usage
    assert usage is not None
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (2100, 1920)
    assert (usage.output_tokens, usage.total_tokens) == (7, 2107)
    assert extra(usage, "cost") == RESPONSES_COST
    [row] = await hosted.gateway.attempts("conv-7")
    assert row.request_id == raw.headers["x-request-id"]
    assert (row.endpoint, row.service_tier, classes(row)) == (
        "/v1/responses",
        "default",
        (180, 1920, 0, 0, 7, "reported"),
    )
    assert row.cost_total == D(RESPONSES_COST)
    [received] = hosted.emulator.requests
    assert received.path == "/v1/responses"
    assert received.body == {
        "model": "openai-responses-cached",
        "instructions": "You are terse.",
        "input": "What is the capital of France?",
        "metadata": {"team": "search"},
    }
    assert received.headers["Authorization"] == f"Bearer {OPENAI_KEY}"


async def test_a_hosted_responses_stream_relays_events_and_bills_response_completed(
    hosted: Hosted,
) -> None:
    stream = await hosted.openai().responses.create(model="gpt", input="Capital?", stream=True)
    request_id = stream.response.headers["x-request-id"]
    seen = [event async for event in stream]
    kinds = [e.type for e in seen]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 7
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    usage = seen[-1].response.usage  # type: ignore[union-attr]
    assert usage is not None
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens) == (
        2100,
        1920,
        7,
    )
    assert extra(usage, "cost") == RESPONSES_COST
    row = await hosted.row(request_id)
    assert (row.endpoint, row.stream, classes(row)) == (
        "/v1/responses",
        True,
        (180, 1920, 0, 0, 7, "reported"),
    )
    assert row.cost_total == D(RESPONSES_COST)


async def test_a_429_fails_over_to_the_next_target_on_the_responses_wire(hosted: Hosted) -> None:
    raw = await hosted.openai().responses.with_raw_response.create(model="gpt-retry", input="x")
    assert extra(raw.parse().usage, "cost") == RESPONSES_COST
    rows = await hosted.gateway.attempts(raw.headers["x-request-id"])
    assert [(r.attempt, r.status, r.upstream, r.endpoint) for r in rows] == [
        (1, "failed", "openai/openai-error-429", "/v1/responses"),
        (2, "completed", "openai/openai-responses-cached", "/v1/responses"),
    ]
    assert rows[0].error is not None and "provider answered 429" in rows[0].error


# -- what a deployment serves ------------------------------------------------------------


OPENAI_SERVED = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
]
# Anthropic's own Messages wire, and Responses translated into its chat.
ANTHROPIC_SERVED = [
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
]


async def test_an_endpoint_no_target_speaks_is_a_400_in_its_shape_naming_what_is_served(
    hosted: Hosted,
) -> None:
    # Messages are translated for OpenAI's models; their tokens are not counted (litellm's
    # count would be an approximation).
    with pytest.raises(anthropic.BadRequestError) as on_count:
        await hosted.anthropic().messages.count_tokens(model="gpt", messages=ASKED["messages"])
    assert on_count.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "model 'gpt' is not served on /v1/messages/count_tokens; it is served "
            "on /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, "
            "/v1/messages",
        },
    }
    with pytest.raises(openai.BadRequestError) as on_embeddings:
        await hosted.openai().embeddings.create(model="claude", input="x")
    assert on_embeddings.value.body["param"] == "model"  # type: ignore[index]
    assert on_embeddings.value.body["message"] == (  # type: ignore[index]
        "model 'claude' is not served on /v1/embeddings; it is served on "
        "/v1/chat/completions, /v1/responses, /v1/messages, /v1/messages/count_tokens"
    )
    assert hosted.emulator.requests == []
    async with hosted.gateway.http(hosted.key) as http:
        listed = (await http.get("/v1/models")).json()["data"]
    assert {m["id"]: m["endpoints"] for m in listed} == {
        "claude": ANTHROPIC_SERVED,
        "claude-retry": ANTHROPIC_SERVED,
        "gpt": OPENAI_SERVED,
        "gpt-retry": OPENAI_SERVED,
        "embed": OPENAI_SERVED,
    }
