"""Anthropic's Messages API on hosted models that speak only OpenAI's chat: the official
``anthropic`` client → a real ``kvgate serve`` → the emulated OpenAI on loopback, through
litellm's adapter. Billed as the same chat to the same target is, to the nano-dollar.

gpt-4.1 bills 2 / 0.50 / 8 USD per million; the cached answer (1,200 prompt tokens, 1,024
of them read from cache, OpenAI's convention: inside ``prompt_tokens``; 30 output) costs
176 x 2 + 1,024 x 0.50 + 30 x 8 = 1,104 micro-dollars.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import pytest

from gateway.db.models import RequestRow
from pricing.book import Price
from tests.factories import litellm
from tests.providers.prices import DEEPSEEK, GEMINI, GPT, OPENROUTER_SONNET
from tests.support.processes import call
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.e2e
D = Decimal
ASKED: dict[str, Any] = {
    "max_tokens": 64,
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}],
}
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Capital of France?"},
]
ANSWER = "Paris is the capital of France."


def expected_cost(
    prompt: int, cached: int, output: int, price: Price = GPT, written: int = 0
) -> Decimal:
    """Independent of pricing/cost.py: each class at the entry's rate, to the nano-dollar."""
    nano = D("0.000000001")
    parts = [
        (prompt - cached - written) * price.input,
        cached * price.cache_read,
        written * (price.cache_write or 0),
        output * price.output,
    ]
    return sum((D(p) / 10**6).quantize(nano) for p in parts)  # type: ignore[return-value]


COST = expected_cost(1200, 1024, 30)


@dataclass(frozen=True)
class Case:
    """A deployment of another provider's convention, and what its chat is billed."""

    model: str
    upstream: str
    classes: tuple[int, int, int, int]  # uncached, cache read, cache write, output
    price: Price
    cost: Decimal


CASES = [
    # DeepSeek's own wire, its hit / miss counts: 232 x 0.27 + 768 x 0.07 + 50 x 1.10.
    Case("deepseek", "deepseek/deepseek-cache-hit", (232, 768, 0, 50), DEEPSEEK, D("0.0001714")),
    # Gemini through litellm's completion: 3808 x 1.25 + 8192 x 0.125 + 200 x 10.
    Case("gemini", "gemini/gemini-cached", (3808, 8192, 0, 200), GEMINI, D("0.007784")),
    # OpenRouter: reads and writes inside prompt_tokens; 500 x 3 + 2000 x 0.30 + 500 x 3.75
    # + 40 x 15.
    Case(
        "openrouter",
        "openrouter/openrouter-cache",
        (500, 2000, 500, 40),
        OPENROUTER_SONNET,
        D("0.004575"),
    ),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from tests.conftest import new_database

    tmp = tmp_path_factory.mktemp("translated")
    with (
        new_database("postgres", tmp) as database_url,
        running_stack(
            tmp,
            database_url,
            prices=[GPT, DEEPSEEK, GEMINI, OPENROUTER_SONNET],
            tenants=("acme",),
        ) as stack,
    ):
        emulator = stack.start_emulator()
        openai_wire = {"api_base": emulator.url + "/v1", "price_model": GPT.model}
        stack.configure(
            [
                litellm("gpt", "openai/openai-cached", **openai_wire),
                litellm("gpt-tools", "openai/openai-tool-call", **openai_wire),
                litellm(
                    "gpt-tools-litellm", "openai/openai-tool-call", via="litellm", **openai_wire
                ),
                litellm("gpt-broken", "openai/openai-broken", **openai_wire),
                litellm("gpt-litellm", "openai/openai-cached", via="litellm", **openai_wire),
                litellm(
                    "gpt-retry",
                    "openai/openai-error-500",
                    **openai_wire,
                    fallbacks=[{"litellm_model": "openai/openai-cached", **openai_wire}],
                ),
                litellm(
                    "deepseek",
                    "deepseek/deepseek-cache-hit",
                    api_base=emulator.url + "/v1",
                    price_model=DEEPSEEK.model,
                ),
                litellm(
                    "gemini",
                    "gemini/gemini-cached",
                    api_base=emulator.url + "/v1beta",
                    price_model=GEMINI.model,
                ),
                litellm(
                    "openrouter",
                    "openrouter/openrouter-cache",
                    api_base=emulator.url + "/v1",
                    price_model=OPENROUTER_SONNET.model,
                ),
            ]
        )
        stack.start_gateway()
        yield stack


def claude(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=stack.key, max_retries=0)


def extra(value: Any, name: str) -> Any:
    return (value.model_extra or {})[name]


def facts(row: RequestRow) -> tuple[Any, ...]:
    return (
        row.endpoint,
        row.status,
        row.upstream,
        row.uncached_tokens,
        row.cache_read_tokens,
        row.cache_write_tokens,
        row.output_tokens,
        row.usage_source,
        row.price_id,
        row.cost_total,
    )


def row_of(stack: Stack, request_id: str) -> RequestRow:
    [row] = stack.rows(RequestRow.request_id == request_id, count=1)
    return row


@pytest.mark.parametrize("model", ["gpt", "gpt-litellm"])
def test_messages_create_is_translated_and_billed_as_the_same_chat(
    stack: Stack, model: str
) -> None:
    """Over OpenAI's own wire and through litellm's completion: an Anthropic answer, its
    usage in Anthropic's convention, the record equal to a chat's to the same target."""
    reply = claude(stack).messages.with_raw_response.create(model=model, **ASKED)
    message = reply.parse()
    assert message.type == "message" and message.role == "assistant"
    assert [(b.type, b.text) for b in message.content] == [("text", ANSWER)]  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (176, 1024)
    assert (usage.cache_creation_input_tokens, usage.output_tokens) == (0, 30)
    assert D(extra(usage, "cost")) == COST == D("0.001104000")
    assert reply.headers["x-kvgate-cost"] == "0.001104000"

    chat = stack.client().chat.completions.with_raw_response.create(model=model, messages=CHAT)  # type: ignore[arg-type]
    as_messages = row_of(stack, reply.headers["x-request-id"])
    as_chat = row_of(stack, chat.headers["x-request-id"])
    same = ("completed", "openai/openai-cached", 176, 1024, 0, 30, "reported", GPT.id, COST)
    assert facts(as_messages) == ("/v1/messages", *same)
    assert facts(as_chat) == ("/v1/chat/completions", *same)
    assert as_messages.finish_reason == "end_turn"


@pytest.mark.parametrize("model", ["gpt", "gpt-litellm"])
def test_messages_stream_is_anthropic_events_billed_in_message_delta(
    stack: Stack, model: str
) -> None:
    with claude(stack).messages.stream(model=model, **ASKED) as stream:
        request_id = stream.response.headers["x-request-id"]
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events if e.type != "text"]
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 7,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(e.text for e in events if e.type == "text") == ANSWER  # type: ignore[union-attr]
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == "end_turn"  # type: ignore[union-attr]
    usage = delta.usage  # type: ignore[union-attr]
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (
        176,
        1024,
        30,
    )
    assert D(extra(usage, "cost")) == COST
    assert final.content[0].text == ANSWER  # type: ignore[union-attr]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (176, 30)
    row = row_of(stack, request_id)
    assert facts(row) == (
        "/v1/messages",
        "completed",
        "openai/openai-cached",
        *(176, 1024, 0, 30),
        "reported",
        GPT.id,
        COST,
    )
    assert row.stream is True


def test_an_upstream_500_fails_over_to_the_next_target(stack: Stack) -> None:
    """Two attempts of one interaction: the 500 on record (nothing billed), then the answer."""
    for stream in (False, True):
        reply = httpx.post(
            stack.url + "/v1/messages",
            headers={"x-api-key": stack.key, "anthropic-version": "2023-06-01"},
            json={"model": "gpt-retry", "stream": stream, **ASKED},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        if stream:
            assert "event: message_stop" in reply.text
        else:
            assert reply.json()["content"][0]["text"] == ANSWER
        rid = reply.headers["x-request-id"]
        rows = stack.rows(RequestRow.request_id.startswith(rid), count=2)
        assert [(r.request_id, r.attempt, r.status, r.upstream) for r in rows] == [
            (rid, 1, "failed", "openai/openai-error-500"),
            (rid + ".2", 2, "completed", "openai/openai-cached"),
        ]
        assert rows[0].error is not None and "500" in rows[0].error
        assert [r.cost_total for r in rows] == [D("0E-9"), COST]


def test_bad_messages_are_400s_in_anthropic_shape(stack: Stack) -> None:
    client = claude(stack)
    with pytest.raises(anthropic.BadRequestError) as empty:
        client.messages.create(model="gpt", max_tokens=2, messages=[])
    assert empty.value.body["type"] == "error"  # type: ignore[index]
    assert empty.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    headers = {"x-api-key": stack.key, "anthropic-version": "2023-06-01"}
    for body in (
        {"model": "gpt", "max_tokens": "two", "messages": []},
        {"model": "gpt", "max_tokens": 2, "messages": [{"role": "user", "content": 7}]},
        {"model": "gpt", "max_tokens": 2, "messages": [{"role": "user", "content": [{"x": 1}]}]},
        {"model": "gpt", "max_tokens": 2, "messages": "hi"},
    ):
        status, _, raw = call(stack.url + "/v1/messages", json.dumps(body).encode(), headers)
        said = json.loads(raw)
        assert status == 400, (body, said)
        assert said["type"] == "error" and said["error"]["type"] == "invalid_request_error"
    # Counting tokens is the provider's own: not approximated for one that counts none.
    with pytest.raises(anthropic.BadRequestError) as counted:
        client.messages.count_tokens(model="gpt", messages=ASKED["messages"])
    message = counted.value.body["error"]["message"]  # type: ignore[index]
    assert "/v1/messages/count_tokens" in message and "/v1/messages" in message


def test_the_models_list_says_messages_are_served(stack: Stack) -> None:
    status, _, raw = call(stack.url + "/v1/models", None, {"authorization": f"Bearer {stack.key}"})
    assert status == 200
    served = {m["id"]: m.get("endpoints") for m in json.loads(raw)["data"]}
    assert "/v1/messages" in served["gpt"] and "/v1/messages/count_tokens" not in served["gpt"]


@pytest.mark.parametrize("case", CASES, ids=[c.model for c in CASES])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_each_providers_convention_is_billed_as_its_chat(
    stack: Stack, case: Case, stream: bool
) -> None:
    """The record of a translated Messages request is the chat's, token class by class."""
    uncached, read, written, output = case.classes
    prompt = uncached + read + written
    assert case.cost == expected_cost(prompt, read, output, case.price, written)
    client = claude(stack)
    if stream:
        with client.messages.stream(model=case.model, **ASKED) as events:
            request_id = events.response.headers["x-request-id"]
            message = events.get_final_message()
    else:
        raw = client.messages.with_raw_response.create(model=case.model, **ASKED)
        request_id, message = raw.headers["x-request-id"], raw.parse()
    assert message.content and message.content[0].type == "text"
    usage = message.usage
    # Anthropic's convention: reads and writes beside input_tokens, not inside it.
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (uncached, read)
    assert (usage.cache_creation_input_tokens, usage.output_tokens) == (written, output)
    chat = stack.client().chat.completions.with_raw_response.create(
        model=case.model,
        messages=CHAT,  # type: ignore[arg-type]
    )
    billed = (case.upstream, *case.classes, "reported", case.price.id, case.cost)
    assert facts(row_of(stack, request_id))[2:] == billed
    assert facts(row_of(stack, chat.headers["x-request-id"]))[2:] == billed


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TOOL_COST = expected_cost(1500, 1280, 18)  # 220 x 2 + 1280 x 0.50 + 18 x 8


@pytest.mark.parametrize("model", ["gpt-tools", "gpt-tools-litellm"])
def test_a_tool_call_comes_back_as_a_tool_use_block(stack: Stack, model: str) -> None:
    """Tools go as OpenAI functions; the call comes back as ``tool_use``, whole and streamed."""
    client = claude(stack)
    asked = {**ASKED, "tools": [WEATHER], "tool_choice": {"type": "auto"}}
    raw = client.messages.with_raw_response.create(model=model, **asked)
    message = raw.parse()
    [block] = message.content
    assert (block.type, block.name, block.input) == ("tool_use", "get_weather", {"city": "Paris"})  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (220, 1280)
    assert D(extra(message.usage, "cost")) == TOOL_COST == D("0.001224000")
    with client.messages.stream(model=model, **asked) as stream:
        request_id = stream.response.headers["x-request-id"]
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]  # type: ignore[union-attr]
    assert {d.type for d in deltas} == {"input_json_delta"}
    assert "".join(d.partial_json for d in deltas) == '{"city":"Paris"}'  # type: ignore[union-attr]
    [block] = final.content
    assert (block.type, block.name, block.input) == ("tool_use", "get_weather", {"city": "Paris"})  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use"
    for rid in (raw.headers["x-request-id"], request_id):
        row = row_of(stack, rid)
        assert (row.uncached_tokens, row.cache_read_tokens, row.output_tokens) == (220, 1280, 18)
        assert (row.finish_reason, row.cost_total) == ("tool_use", TOOL_COST)


def test_a_stream_that_breaks_ends_with_an_anthropic_error_event(stack: Stack) -> None:
    """The provider's stream ends half way: the client gets ``event: error`` after the text
    so far, in Anthropic's shape; the record is failed, its prompt estimated."""
    with httpx.stream(
        "POST",
        stack.url + "/v1/messages",
        headers={"x-api-key": stack.key, "anthropic-version": "2023-06-01"},
        json={"model": "gpt-broken", "stream": True, **ASKED},
        timeout=30,
    ) as reply:
        assert reply.status_code == 200
        rid = reply.headers["x-request-id"]
        text = reply.read().decode()
    names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "error"
    assert "message_stop" not in names and "message_delta" not in names
    error = json.loads(text.rsplit("data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    row = row_of(stack, rid)
    assert (row.status, row.usage_source) == ("failed", "estimated")
    assert row.error is not None and "[DONE]" in row.error
