"""Messages translated for hosted models that speak only OpenAI's chat: litellm is loaded
for them at the first request that needs it, not at startup."""

from __future__ import annotations

import aiohttp
import anthropic
import pytest

from gateway.config import Settings
from gateway.serving.hosted import build_hosted
from tests.factories import deployments, litellm
from tests.providers.emulator import Emulator
from tests.providers.prices import GPT
from tests.serving.conftest import Harness


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
            extra_headers={"x-interaction-id": "conv-9"},
        )
    assert reply.content[0].text == "Paris is the capital of France."  # type: ignore[union-attr]
    [sent] = emulator.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == "Bearer sk-openai-test"
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
    [row] = await gateway.attempts(reply._request_id)  # type: ignore[attr-defined]
    assert (row.endpoint, row.interaction_id, row.end_user) == ("/v1/messages", "conv-9", "user-7")
