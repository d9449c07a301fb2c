"""Messages translated for hosted models that speak only OpenAI's chat: litellm is loaded
for them at the first request that needs it, not at startup."""

from __future__ import annotations

import aiohttp
import anthropic
import pytest

from gateway.config import Settings
from gateway.serving.hosted import build_hosted
from gateway.upstream.providers import Providers
from tests.factories import deployments, litellm
from tests.providers.emulator import Emulator
from tests.providers.prices import GPT, SONNET
from tests.serving.conftest import D, Harness


async def test_litellm_is_loaded_at_the_first_translation_not_at_startup() -> None:
    """OpenAI-wire chat needs no litellm; Messages to the same model does, once."""
    models = deployments(
        litellm("gpt", "openai/gpt-4.1", api_base="http://127.0.0.1:9/v1"),
        litellm("deepseek", "deepseek/deepseek-chat"),
    )
    async with aiohttp.ClientSession() as session:
        backend = await build_hosted(Settings(), {d.name: d for d in models}, session)
        assert backend is not None and not backend.providers.loaded
        await backend.translation.ready()
        assert backend.providers.loaded
        await backend.translation.ready()  # once: a second call has nothing to do
        assert backend.providers.loaded


async def test_the_provider_is_sent_the_messages_as_chat(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """System first, blocks as parts, the end user as ``user``, ``max_tokens`` and
    ``stop_sequences`` as chat's; kvgate's own members, ``top_k`` and ``cache_control``
    (which OpenAI does not take) stay behind; the provider's key in its own header."""
    monkeypatch.setenv("KVGATE_TEST_OPENAI_KEY", "sk-openai-test")
    emulator = Emulator()
    url = await harness.serve(emulator.app())
    harness.add_prices(GPT)
    gateway = await harness.gateway(
        litellm(
            "gpt",
            "openai/openai-cached",
            api_base=url + "/v1",
            api_key_env="KVGATE_TEST_OPENAI_KEY",
            price_model=GPT.model,
        )
    )
    async with anthropic.AsyncAnthropic(
        base_url=gateway.url, api_key=harness.tenant.key, max_retries=0
    ) as client:
        reply = await client.messages.create(
            model="gpt",
            max_tokens=64,
            system=[{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}
            ],
            stop_sequences=["\n\n"],
            metadata={"user_id": "user-7"},
            extra_body={"cache_salt": "mine", "top_k": 5},
            extra_headers={"x-interaction-id": "conv-9", "anthropic-beta": "some-beta"},
        )
    assert reply.content[0].text == "Paris is the capital of France."  # type: ignore[union-attr]
    [sent] = emulator.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == "Bearer sk-openai-test"
    assert not {"anthropic-version", "anthropic-beta", "x-api-key"} & {
        name.lower() for name in sent.headers
    }
    assert sent.body == {
        "model": "openai-cached",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
            {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]},
        ],
        "max_tokens": 64,
        "stop": ["\n\n"],
        "user": "user-7",
    }
    [row] = await gateway.attempts("conv-9")
    assert (row.endpoint, row.interaction_id, row.end_user) == ("/v1/messages", "conv-9", "user-7")


ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}
ASKED = {"max_tokens": 64, "messages": [{"role": "user", "content": "Capital of France?"}]}


async def test_an_anthropic_target_that_fails_is_followed_by_a_translated_one(
    harness: Harness,
) -> None:
    """Anthropic's own wire first (a 500), then OpenAI's chat, translated: two attempts of
    one interaction, the second billed as OpenAI's chat."""
    emulator = Emulator()
    url = await harness.serve(emulator.app())
    harness.add_prices(SONNET, GPT)
    fallback = {"litellm_model": "openai/openai-cached", "api_base": url + "/v1"}
    gateway = await harness.gateway(
        litellm(
            "claude",
            "anthropic/anthropic-error-500",
            api_base=url,
            price_model=SONNET.model,
            fallbacks=[{**fallback, "price_model": GPT.model}],
        )
    )
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(
            "/v1/messages",
            json={"model": "claude", **ASKED},
            headers={**ANTHROPIC_HEADERS, "x-interaction-id": "conv-1"},
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["cache_read_input_tokens"] == 1024
    rows = await gateway.attempts("conv-1", count=2)
    assert [(r.attempt, r.status, r.upstream, r.price_id, r.cost_total) for r in rows] == [
        (1, "failed", "anthropic/anthropic-error-500", SONNET.id, D("0E-9")),
        (2, "completed", "openai/openai-cached", GPT.id, D("0.001104000")),
    ]
    assert [r.path for r in emulator.requests] == ["/v1/messages", "/v1/chat/completions"]


async def test_a_client_that_leaves_a_translated_stream_is_recorded_cancelled(
    harness: Harness,
) -> None:
    """The provider's chat stream is closed; the record keeps the tokens so far."""
    emulator = Emulator(event_delay_s=0.2)
    url = await harness.serve(emulator.app())
    harness.add_prices(GPT)
    gateway = await harness.gateway(
        litellm("gpt", "openai/openai-cached", api_base=url + "/v1", price_model=GPT.model)
    )
    async with (
        gateway.http(harness.tenant.key) as http,
        http.stream(
            "POST",
            "/v1/messages",
            json={"model": "gpt", "stream": True, **ASKED},
            headers={**ANTHROPIC_HEADERS, "x-interaction-id": "conv-2"},
        ) as reply,
    ):
        async for line in reply.aiter_lines():
            if line.startswith("event: content_block_delta"):
                break
    [row] = await gateway.attempts("conv-2", count=1)
    assert (row.status, row.error, row.usage_source) == (
        "cancelled",
        "client disconnected",
        "estimated",
    )
    assert 1 <= row.output_tokens < 7


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "image", "source": {"type": "base64"}}],
        [{"type": "tool_result"}],
        [{"type": "document", "source": 7}],
        [{"type": "tool_use", "id": "t1", "name": "f", "input": "not an object"}],
        [{"type": "thinking"}],
        [{"type": "no-such-block", "text": "x"}],
        [{"type": "text"}],
    ],
)
async def test_malformed_blocks_are_never_a_5xx(
    harness: Harness, content: list[dict[str, object]]
) -> None:
    """The gateway's own checks refuse some (a 400 in Anthropic's shape); litellm's adapter
    sends the others on as it reads them, and the provider judges them (its 400 would be
    passed on as a 400; the emulator answers them all)."""
    emulator = Emulator()
    url = await harness.serve(emulator.app())
    harness.add_prices(GPT)
    gateway = await harness.gateway(
        litellm("gpt", "openai/openai-cached", api_base=url + "/v1", price_model=GPT.model)
    )
    body = {"model": "gpt", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    async with gateway.http(harness.tenant.key) as http:
        for stream in (False, True):
            reply = await http.post(
                "/v1/messages", json={**body, "stream": stream}, headers=ANTHROPIC_HEADERS
            )
            assert reply.status_code < 500, reply.text
            if reply.status_code != 200:
                assert reply.json()["type"] == "error", reply.text


@pytest.mark.parametrize("member", [{"tools": "x"}, {"tool_choice": "auto"}])
async def test_a_body_litellm_cannot_translate_is_a_400_in_anthropics_shape(
    harness: Harness, member: dict[str, object]
) -> None:
    emulator = Emulator()
    url = await harness.serve(emulator.app())
    gateway = await harness.gateway(litellm("gpt", "openai/openai-cached", api_base=url + "/v1"))
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(
            "/v1/messages", json={"model": "gpt", **ASKED, **member}, headers=ANTHROPIC_HEADERS
        )
    assert reply.status_code == 400, reply.text
    said = reply.json()
    assert (said["type"], said["error"]["type"]) == ("error", "invalid_request_error")
    assert emulator.requests == []


async def test_without_litellm_a_translated_messages_request_says_what_to_install(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(self: Providers) -> None:
        raise ImportError("No module named 'litellm'")

    emulator = Emulator()
    url = await harness.serve(emulator.app())
    gateway = await harness.gateway(litellm("gpt", "openai/openai-cached", api_base=url + "/v1"))
    monkeypatch.setattr(Providers, "load", missing)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(
            "/v1/messages", json={"model": "gpt", **ASKED}, headers=ANTHROPIC_HEADERS
        )
        chat = await http.post(
            "/v1/chat/completions",
            json={"model": "gpt", "messages": [{"role": "user", "content": "x"}]},
        )
    assert reply.status_code == 502, reply.text
    said = reply.json()
    assert said["type"] == "error" and "pip install 'kvgate[providers]'" in said["error"]["message"]
    assert chat.status_code == 200  # OpenAI's own chat wire needs no litellm
    assert emulator.requests and all(r.path == "/v1/chat/completions" for r in emulator.requests)


async def test_a_providers_429_reaches_the_client_as_anthropics_rate_limit_error(
    harness: Harness,
) -> None:
    """The provider's status and message, in Anthropic's error shape; one failed attempt."""
    emulator = Emulator()
    url = await harness.serve(emulator.app())
    gateway = await harness.gateway(litellm("gpt", "openai/openai-error-429", api_base=url + "/v1"))
    async with anthropic.AsyncAnthropic(
        base_url=gateway.url, api_key=harness.tenant.key, max_retries=0
    ) as client:
        with pytest.raises(anthropic.RateLimitError) as limited:
            await client.messages.create(
                model="gpt", **ASKED, extra_headers={"x-interaction-id": "conv-3"}
            )
    body = limited.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "rate_limit_error"
    assert "openai/openai-error-429: provider answered 429" in body["error"]["message"]
    [row] = await gateway.attempts("conv-3", count=1)
    assert (row.endpoint, row.status, row.upstream) == (
        "/v1/messages",
        "failed",
        "openai/openai-error-429",
    )
