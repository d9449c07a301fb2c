"""OpenAI's Responses API on hosted models whose provider does not speak it: the official
``openai`` client → a real ``kvgate serve`` → the emulated providers on loopback, through
litellm's Responses bridge. Billed as the same chat to the same target is, to the
nano-dollar, and answered in the Responses shape with ``usage.cost``.

The conventions: Groq's and DeepSeek's OpenAI chat wire (cached tokens inside
``prompt_tokens``; DeepSeek's hit / miss counts), Gemini's and Anthropic's through
litellm's completion (their cached content; Anthropic's reads beside ``input_tokens``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest

from gateway.db.models import RequestRow
from pricing.book import Price
from tests.factories import litellm
from tests.providers.prices import DEEPSEEK, GEMINI, GPT, SONNET
from tests.providers.test_translated_messages import ANSWER, expected_cost, facts, row_of
from tests.support.processes import call
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.e2e
D = Decimal
INSTRUCTIONS = "You are terse."
QUESTION = "Capital of France?"
CHAT = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]


@dataclass(frozen=True)
class Case:
    """A deployment of one provider's convention, and what its chat is billed."""

    model: str
    upstream: str
    classes: tuple[int, int, int, int]  # uncached, cache read, cache write, output
    price: Price
    cost: Decimal


CASES = [
    # Groq's OpenAI chat wire, OpenAI's convention: 176 x 2 + 1024 x 0.50 + 30 x 8.
    Case("groq", "groq/openai-cached", (176, 1024, 0, 30), GPT, D("0.001104")),
    # DeepSeek's own wire, its hit / miss counts: 232 x 0.27 + 768 x 0.07 + 50 x 1.10.
    Case("deepseek", "deepseek/deepseek-cache-hit", (232, 768, 0, 50), DEEPSEEK, D("0.0001714")),
    # Gemini through litellm's completion: 3808 x 1.25 + 8192 x 0.125 + 200 x 10.
    Case("gemini", "gemini/gemini-cached", (3808, 8192, 0, 200), GEMINI, D("0.007784")),
    # Anthropic through litellm's completion: 50 x 3 + 2000 x 0.30 + 80 x 15.
    Case("claude", "anthropic/anthropic-cache-read", (50, 2000, 0, 80), SONNET, D("0.00195")),
]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TOOL_COST = expected_cost(1500, 1280, 18)  # 220 x 2 + 1280 x 0.50 + 18 x 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from tests.conftest import new_database

    tmp = tmp_path_factory.mktemp("translated-responses")
    with (
        new_database("postgres", tmp) as database_url,
        running_stack(
            tmp, database_url, prices=[GPT, DEEPSEEK, GEMINI, SONNET], tenants=("acme",)
        ) as stack,
    ):
        emulator = stack.start_emulator()
        groq = {"api_base": emulator.url + "/v1", "price_model": GPT.model}
        stack.configure(
            [
                litellm("groq", "groq/openai-cached", **groq),
                litellm("groq-tools", "groq/openai-tool-call", **groq),
                litellm("groq-tools-litellm", "groq/openai-tool-call", via="litellm", **groq),
                litellm("groq-broken", "groq/openai-broken", **groq),
                litellm(
                    "groq-retry",
                    "groq/openai-error-500",
                    **groq,
                    fallbacks=[{"litellm_model": "groq/openai-cached", **groq}],
                ),
                litellm("groq-429", "groq/openai-error-429", **groq),
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
                    "claude",
                    "anthropic/anthropic-cache-read",
                    api_base=emulator.url,
                    price_model=SONNET.model,
                ),
            ]
        )
        stack.start_gateway()
        yield stack


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key, max_retries=0)


def cost_of(usage: Any) -> Decimal:
    return D((usage.model_extra or {})["cost"])


def post(stack: Stack, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        stack.url + "/v1/responses",
        headers={"authorization": f"Bearer {stack.key}"},
        json=body,
        timeout=30,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.model for c in CASES])
def test_a_response_is_translated_and_billed_as_the_same_chat(stack: Stack, case: Case) -> None:
    """A Response with the answer as its message; usage in the Responses shape (cached
    tokens inside ``input_tokens``) plus ``usage.cost``; the record is the same chat's."""
    uncached, read, written, output = case.classes
    assert case.cost == expected_cost(uncached + read + written, read, output, case.price, written)
    raw = client(stack).responses.with_raw_response.create(
        model=case.model, instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=64
    )
    response = raw.parse()
    assert response.object == "response" and response.status == "completed"
    assert response.id.startswith("resp_") and response.store is False
    assert response.output_text == ANSWER
    usage = response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (
        uncached + read + written,
        read,
    )
    assert (usage.output_tokens, usage.total_tokens) == (output, uncached + read + written + output)
    assert cost_of(usage) == case.cost
    assert D(raw.headers["x-kvgate-cost"]) == case.cost

    chat = client(stack).chat.completions.with_raw_response.create(model=case.model, messages=CHAT)  # type: ignore[arg-type]
    billed = ("completed", case.upstream, *case.classes, "reported", case.price.id, case.cost)
    row = row_of(stack, raw.headers["x-request-id"])
    assert facts(row) == ("/v1/responses", *billed)
    assert facts(row_of(stack, chat.headers["x-request-id"])) == ("/v1/chat/completions", *billed)
    assert (row.finish_reason, row.stream) == ("completed", False)


@pytest.mark.parametrize("case", CASES, ids=[c.model for c in CASES])
def test_a_streamed_response_is_responses_events_billed_in_response_completed(
    stack: Stack, case: Case
) -> None:
    """response.created … output_text.delta … response.completed, the last carrying the
    billed usage and cost; the record is the same as the whole answer's."""
    with client(stack).responses.with_streaming_response.create(
        model=case.model, instructions=INSTRUCTIONS, input=QUESTION, stream=True
    ) as raw:
        request_id = raw.headers["x-request-id"]
        events = list(raw.parse())
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.completed") == 1
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text.startswith("Paris is the capital")  # each fixture's stream says it its way
    ids = {e.response.id for e in events if hasattr(e, "response")}  # type: ignore[union-attr]
    assert len(ids) == 1 and next(iter(ids)).startswith("resp_")
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == text and completed.store is False
    uncached, read, written, output = case.classes
    usage = completed.usage
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (
        uncached + read + written,
        read,
    )
    assert usage.output_tokens == output
    assert cost_of(usage) == case.cost
    row = row_of(stack, request_id)
    billed = (case.upstream, *case.classes, "reported", case.price.id, case.cost)
    assert facts(row) == ("/v1/responses", "completed", *billed)
    assert (row.finish_reason, row.stream) == ("completed", True)


@pytest.mark.parametrize("model", ["groq-tools", "groq-tools-litellm"])
def test_a_tool_call_comes_back_as_a_function_call_item(stack: Stack, model: str) -> None:
    """Function tools go as chat's; the call comes back as a ``function_call`` output item,
    whole and streamed (its arguments as deltas), billed as the chat."""
    asked: dict[str, Any] = {"model": model, "input": QUESTION, "tools": [WEATHER]}
    raw = client(stack).responses.with_raw_response.create(**asked)
    response = raw.parse()
    [item] = response.output
    assert item.type == "function_call"
    assert (item.name, json.loads(item.arguments)) == ("get_weather", {"city": "Paris"})
    assert item.call_id == "call_Wx2pQ9"
    assert response.usage is not None and cost_of(response.usage) == TOOL_COST
    with client(stack).responses.with_streaming_response.create(**asked, stream=True) as streamed:
        request_id = streamed.headers["x-request-id"]
        events = list(streamed.parse())
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]  # type: ignore[union-attr]
    assert json.loads("".join(deltas)) == {"city": "Paris"}
    [final] = events[-1].response.output  # type: ignore[union-attr]
    assert (final.type, final.name, json.loads(final.arguments)) == (
        "function_call",
        "get_weather",
        {"city": "Paris"},
    )
    assert cost_of(events[-1].response.usage) == TOOL_COST  # type: ignore[union-attr]
    for rid in (raw.headers["x-request-id"], request_id):
        row = row_of(stack, rid)
        assert (row.uncached_tokens, row.cache_read_tokens, row.output_tokens) == (220, 1280, 18)
        assert row.cost_total == TOOL_COST


def test_an_upstream_500_fails_over_to_the_next_target(stack: Stack) -> None:
    """Two attempts of one interaction: the 500 on record (nothing billed), then the answer."""
    cost = expected_cost(1200, 1024, 30)
    for stream in (False, True):
        reply = post(stack, {"model": "groq-retry", "input": QUESTION, "stream": stream})
        assert reply.status_code == 200, reply.text
        if stream:
            assert "event: response.completed" in reply.text
        else:
            assert reply.json()["output"][0]["content"][0]["text"] == ANSWER
        rid = reply.headers["x-request-id"]
        rows = stack.rows(RequestRow.request_id.startswith(rid), count=2)
        assert [(r.request_id, r.attempt, r.status, r.upstream) for r in rows] == [
            (rid, 1, "failed", "groq/openai-error-500"),
            (rid + ".2", 2, "completed", "groq/openai-cached"),
        ]
        assert [r.cost_total for r in rows] == [D("0E-9"), cost]


def test_a_providers_429_is_a_429_in_openais_shape(stack: Stack) -> None:
    with pytest.raises(openai.RateLimitError) as limited:
        client(stack).responses.create(model="groq-429", input=QUESTION)
    assert limited.value.body["type"] == "rate_limit_error"  # type: ignore[index]


def test_previous_response_id_is_refused_where_nothing_is_stored(stack: Stack) -> None:
    """A translated target keeps no responses: a follow-up is a 400 saying so, not an
    answer without the conversation it continues."""
    first = client(stack).responses.create(model="groq", input=QUESTION, store=True)
    assert first.store is False
    with pytest.raises(openai.BadRequestError) as refused:
        client(stack).responses.create(
            model="groq", input="And of Spain?", previous_response_id=first.id
        )
    error = refused.value.body
    assert error["param"] == "previous_response_id"  # type: ignore[index]
    assert "none is stored" in error["message"]  # type: ignore[index]


def test_bad_responses_are_400s_in_openais_shape(stack: Stack) -> None:
    """Never a 5xx: what the edge's schema or litellm's bridge refuses is a 400."""
    headers = {"authorization": f"Bearer {stack.key}"}
    for body in (
        {"model": "groq", "input": 7},
        {"model": "groq", "input": [{"role": "user", "content": 7}]},
        {"model": "groq", "input": [{"type": "function_call_output", "output": "x"}]},
        {"model": "groq", "input": "hi", "tools": [{"type": "function"}]},
        {"model": "groq", "input": "hi", "tools": [{"type": ""}]},
        {"model": "groq", "input": "hi", "tools": [{"type": "code_interpreter"}]},
        {"model": "groq", "input": [{"type": "message", "role": "user", "content": [{"x": 1}]}]},
    ):
        status, _, raw = call(stack.url + "/v1/responses", json.dumps(body).encode(), headers)
        said = json.loads(raw)
        assert status == 400, (body, said)
        assert said["error"]["type"] == "invalid_request_error", said


def test_a_stream_that_breaks_ends_with_an_error_event(stack: Stack) -> None:
    """The provider's stream ends half way: ``event: error`` after the text so far, no
    response.completed; the record is failed, its usage estimated."""
    reply = post(stack, {"model": "groq-broken", "input": QUESTION, "stream": True})
    assert reply.status_code == 200
    names = [line[7:] for line in reply.text.splitlines() if line.startswith("event: ")]
    assert names[0] == "response.created" and names[-1] == "error"
    assert "response.completed" not in names
    row = row_of(stack, reply.headers["x-request-id"])
    assert (row.status, row.usage_source) == ("failed", "estimated")


def test_the_models_list_says_responses_are_served(stack: Stack) -> None:
    status, _, raw = call(stack.url + "/v1/models", None, {"authorization": f"Bearer {stack.key}"})
    assert status == 200
    served = {m["id"]: m.get("endpoints") for m in json.loads(raw)["data"]}
    for model in ("groq", "deepseek", "gemini", "claude"):
        assert "/v1/responses" in served[model], served[model]
