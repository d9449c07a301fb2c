"""Responses translated for hosted models that do not speak OpenAI's Responses wire: what
the provider is sent, and what is recorded when a client leaves (SQLite and Postgres)."""

from __future__ import annotations

import openai
import pytest

from tests.factories import litellm
from tests.providers.emulator import Emulator
from tests.providers.prices import DEEPSEEK, GPT
from tests.serving.conftest import D, Harness


async def test_the_provider_is_sent_the_response_request_as_chat(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instructions first, input items as messages (a function call and its output as the
    assistant's tool call and the tool's answer), function tools as chat's, the output
    limit as ``max_tokens``; kvgate's own members and ``store`` stay behind; the provider's
    key in its own header. Billed in DeepSeek's convention, recorded with the end user."""
    monkeypatch.setenv("KVGATE_TEST_DEEPSEEK_KEY", "sk-deepseek-test")
    emulator = Emulator()
    url = await harness.serve(emulator.app())
    harness.add_prices(DEEPSEEK)
    gateway = await harness.gateway(
        litellm(
            "deepseek",
            "deepseek/deepseek-cache-hit",
            api_base=url + "/v1",
            api_key_env="KVGATE_TEST_DEEPSEEK_KEY",
            price_model=DEEPSEEK.model,
        )
    )
    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key=harness.tenant.key, max_retries=0
    ) as client:
        response = await client.responses.create(
            model="deepseek",
            instructions="Be terse.",
            input=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city":"Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "Sunny."},
            ],
            tools=[
                {
                    "type": "function",
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {}},
                    "strict": False,
                }
            ],
            max_output_tokens=64,
            temperature=0.5,
            store=True,
            user="user-7",
            metadata={"interaction_id": "conv-9", "team": "blue"},
            extra_body={"cache_salt": "mine"},
        )
    assert response.store is False and response.metadata == {"team": "blue"}
    [sent] = emulator.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == "Bearer sk-deepseek-test"
    assert sent.body == {
        "model": "deepseek-cache-hit",
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "index": 0,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "",
                    "parameters": {"type": "object", "properties": {}},
                    "strict": False,
                },
            }
        ],
        "max_tokens": 64,
        "temperature": 0.5,
        "user": "user-7",
    }
    [row] = await gateway.attempts("conv-9")
    assert (row.endpoint, row.interaction_id, row.end_user) == ("/v1/responses", "conv-9", "user-7")
    assert (row.uncached_tokens, row.cache_read_tokens, row.output_tokens) == (232, 768, 50)
    assert row.cost_total == D("0.000171400")


async def test_a_client_that_leaves_a_translated_responses_stream_is_recorded_cancelled(
    harness: Harness,
) -> None:
    """The provider's chat stream is closed; the record keeps the tokens so far."""
    emulator = Emulator(event_delay_s=0.2)
    url = await harness.serve(emulator.app())
    harness.add_prices(GPT)
    gateway = await harness.gateway(
        litellm("groq", "groq/openai-cached", api_base=url + "/v1", price_model=GPT.model)
    )
    async with (
        gateway.http(harness.tenant.key) as http,
        http.stream(
            "POST",
            "/v1/responses",
            json={"model": "groq", "stream": True, "input": "Capital of France?"},
            headers={"x-interaction-id": "conv-2"},
        ) as reply,
    ):
        async for line in reply.aiter_lines():
            if line.startswith("event: response.output_text.delta"):
                break
    [row] = await gateway.attempts("conv-2", count=1)
    assert (row.endpoint, row.status, row.error, row.usage_source) == (
        "/v1/responses",
        "cancelled",
        "client disconnected",
        "estimated",
    )
    assert 1 <= row.output_tokens < 7
