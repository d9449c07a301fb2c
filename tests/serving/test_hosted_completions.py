"""Hosted ``/v1/completions`` over the provider's own OpenAI wire, in-process: the official
``openai`` client → the gateway → tests/providers' emulator (its recorded wire answers).

Costs are computed by hand from the fixtures (tests/providers/fixtures/*-completion.*):
OpenAI's legacy completions reports its cached tokens inside the prompt, DeepSeek its
hit/miss counts, riding on the stream's last content chunk. litellm serves no completions
for the gateway, so its record is compared with the chat record of the same usage on both
chat paths (the same provider convention, the same price, token by token).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import openai
import pytest

from gateway.db.models import RequestRow
from gateway.serving.chatwire import COMPLETION_PARAMETERS
from tests.factories import litellm
from tests.providers.emulator import Emulator
from tests.providers.prices import DEEPSEEK, GPT, SONNET
from tests.serving.conftest import Harness
from tests.serving.test_hosted_chat import MESSAGES, Hosted, record
from tests.support.inprocess import refusing_url

D = Decimal
KEY = "sk-openai-test"
KEY_ENV = "KVGATE_TEST_OPENAI_KEY"
PROMPT = "Q: What is the capital of France?\nA:"  # 36 characters
TEXT = " Paris is the capital of France."
COMPLETIONS = "/v1/completions"
# uncached, cache read, cache write, output, total
COSTS = (D("0.000352000"), D("0.000512000"), D("0E-9"), D("0.000240000"), D("0.001104000"))


@pytest.fixture
async def hosted(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hosted]:
    monkeypatch.setenv(KEY_ENV, KEY)
    emulator = Emulator()
    url = await harness.serve(emulator.app())
    harness.add_prices(GPT, DEEPSEEK, SONNET)
    base = {"api_base": url + "/v1", "api_key_env": KEY_ENV}
    gpt = {**base, "price_model": GPT.model}
    completion = {"litellm_model": "openai/openai-completion", **gpt}
    claude = {"api_base": url, "api_key_env": KEY_ENV, "price_model": SONNET.model}
    entries = [
        litellm("gpt-text", "openai/openai-completion", **gpt),
        litellm("no-usage", "openai/openai-completion-no-usage", **gpt),
        litellm(
            "deepseek-text", "deepseek/deepseek-completion", **base, price_model=DEEPSEEK.model
        ),
        *(
            litellm(
                f"deepseek-chat-{via}",
                "deepseek/deepseek-cache-hit",
                **base,
                via=via,
                price_model=DEEPSEEK.model,
            )
            for via in ("auto", "litellm")
        ),
        litellm(
            "retry",
            "openai/openai-error-500",
            **gpt,
            fallbacks=[
                # Anthropic serves no completions: not an attempt of them.
                {"litellm_model": "anthropic/anthropic-cache-read", **claude},
                {"litellm_model": "openai/openai-error-429", **gpt},
                {**completion, "api_base": refusing_url() + "/v1"},
                completion,
            ],
        ),
        litellm("rejected", "openai/openai-error-400", **gpt, fallbacks=[completion]),
        litellm("claude", "anthropic/anthropic-cache-read", **claude),
    ]
    gateway = await harness.gateway(*entries)
    made = Hosted(emulator, gateway, harness.tenant.key)
    yield made
    if made.made is not None:
        await made.made.close()


async def _complete(hosted: Hosted, model: str, **extra: Any) -> tuple[dict[str, Any], RequestRow]:
    raw = await hosted.client().completions.with_raw_response.create(
        model=model, prompt=PROMPT, max_tokens=64, **extra
    )
    reply = raw.parse()
    assert reply.usage is not None
    seen = {
        "text": reply.choices[0].text,
        "finish": reply.choices[0].finish_reason,
        "usage": (reply.usage.prompt_tokens, reply.usage.completion_tokens),
        "cached": reply.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
        if reply.usage.prompt_tokens_details
        else None,
        "cost": (reply.usage.model_extra or {})["cost"],
        "source": (reply.usage.model_extra or {})["usage_source"],
        "cost_header": raw.headers.get("x-kvgate-cost"),
    }
    [row] = await hosted.gateway.attempts(raw.headers["x-request-id"])
    return seen, row


async def _stream(hosted: Hosted, model: str) -> tuple[dict[str, Any], RequestRow]:
    stream = await hosted.client().completions.create(
        model=model, prompt=PROMPT, stream=True, stream_options={"include_usage": True}
    )
    request_id = stream.response.headers["x-request-id"]
    chunks = [chunk async for chunk in stream]
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert all(c.usage is None for c in chunks[:-1])  # only the billed usage reaches the client
    seen = {
        "text": "".join(c.choices[0].text for c in chunks if c.choices),
        "finish": [c.choices[0].finish_reason for c in chunks if c.choices][-1],
        "usage": (usage.prompt_tokens, usage.completion_tokens),
        "cached": usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
        if usage.prompt_tokens_details
        else None,
        "cost": (usage.model_extra or {})["cost"],
        "source": (usage.model_extra or {})["usage_source"],
        "cost_header": None,  # a stream's cost comes in its usage chunk only
    }
    [row] = await hosted.gateway.attempts(request_id)
    return seen, row


async def test_openai_completions_are_billed_with_their_cached_tokens_streamed_and_not(
    hosted: Hosted,
) -> None:
    """176 x 2 + 1024 x 0.50 + 30 x 8 per million (the prompt's cached tokens at the
    cache-read rate), on /v1/completions, with usage asked for on the stream."""
    for send, stream in ((_complete, False), (_stream, True)):
        seen, row = await send(hosted, "gpt-text")
        assert seen == {
            "text": TEXT,
            "finish": "stop",
            "usage": (1200, 30),
            "cached": 1024,
            "cost": "0.001104000",
            "source": "reported",
            "cost_header": None if stream else "0.001104000",
        }
        assert record(row) == {
            "attempt": 1,
            "status": "completed",
            "upstream": "openai/openai-completion",
            "tokens": (176, 1024, 0, 0, 30),
            "source": "reported",
            "costs": COSTS,
            "finish": "stop",
            "tier": None,
            "price": GPT.id,
            "stream": stream,
            "endpoint": COMPLETIONS,
        }
    sent = hosted.emulator.requests
    assert [r.path for r in sent] == [COMPLETIONS] * 2
    assert sent[0].body == {"model": "openai-completion", "prompt": PROMPT, "max_tokens": 64}
    assert sent[1].body == {
        "model": "openai-completion",
        "prompt": PROMPT,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert {r.headers["Authorization"] for r in sent} == {f"Bearer {KEY}"}


async def test_deepseek_completions_are_recorded_as_its_chat_of_the_same_usage(
    hosted: Hosted,
) -> None:
    """232 x 0.27 + 768 x 0.07 + 50 x 1.10 per million, by DeepSeek's hit/miss counts; the
    stream's usage rides on its last content chunk and is taken off it. The same as the
    chat record of the same usage, over DeepSeek's wire and through litellm."""
    for send in (_complete, _stream):
        seen, row = await send(hosted, "deepseek-text")
        assert (seen["text"], seen["usage"], seen["cached"], seen["cost"]) == (
            TEXT,
            (1000, 50),
            768,
            "0.000171400",
        )
        completions = record(row)
        assert completions["endpoint"] == COMPLETIONS
        assert completions["tokens"] == (232, 768, 0, 0, 50)
        for via in ("auto", "litellm"):
            chat = await hosted.client().chat.completions.create(
                model=f"deepseek-chat-{via}",
                messages=MESSAGES,  # type: ignore[arg-type]
                stream=completions["stream"],
            )
            if completions["stream"]:
                async for _ in chat:  # type: ignore[union-attr]
                    pass
            rows = await hosted.gateway.attempts()
            assert {**record(rows[-1]), "endpoint": COMPLETIONS} == {
                **completions,
                "upstream": "deepseek/deepseek-cache-hit",
            }


async def test_a_stream_without_usage_is_estimated_from_its_text_chunks(hosted: Hosted) -> None:
    """36 characters of prompt / 4, and seven chunks of text (the finishing chunk, with no
    text, counts none): 9 x 2 + 7 x 8 per million, marked estimated."""
    seen, row = await _stream(hosted, "no-usage")
    assert (seen["usage"], seen["cost"], seen["source"]) == ((9, 7), "0.000074000", "estimated")
    assert record(row)["tokens"] == (9, 0, 0, 0, 7)
    assert row.cost_total == D("0.000074000")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_failover_is_as_chats(hosted: Hosted, stream: bool) -> None:
    """A 500, a 429, a closed port (tried twice: a connection that failed before any byte
    is tried once more), then an answer; the Anthropic fallback serves no completions and
    is passed over."""
    client = hosted.client()
    if stream:
        made = await client.completions.create(model="retry", prompt=PROMPT, stream=True)
        request_id = made.response.headers["x-request-id"]
        text = "".join([c.choices[0].text async for c in made if c.choices])
    else:
        raw = await client.completions.with_raw_response.create(model="retry", prompt=PROMPT)
        request_id = raw.headers["x-request-id"]
        text = raw.parse().choices[0].text
    assert text == TEXT
    rows = await hosted.gateway.attempts(request_id)
    assert [(r.attempt, r.status, r.upstream, r.endpoint, r.cost_total) for r in rows] == [
        (1, "failed", "openai/openai-error-500", COMPLETIONS, D("0E-9")),
        (2, "failed", "openai/openai-error-429", COMPLETIONS, D("0E-9")),
        (3, "failed", "openai/openai-completion", COMPLETIONS, D("0E-9")),
        (4, "failed", "openai/openai-completion", COMPLETIONS, D("0E-9")),
        (5, "completed", "openai/openai-completion", COMPLETIONS, D("0.001104000")),
    ]
    assert [r.error is not None for r in rows] == [True] * 4 + [False]
    assert "provider answered 500" in (rows[0].error or "")
    assert "upstream unreachable" in (rows[2].error or "") and rows[2].error == rows[3].error
    assert [r.path for r in hosted.emulator.requests] == [COMPLETIONS] * 3


async def test_bad_input_is_a_400(hosted: Hosted) -> None:
    """The gateway's own checks, a model that serves no completions, and the provider's
    400 (said with its message, not failed over): a 400 each, never a 5xx."""
    client = hosted.client()
    with pytest.raises(openai.BadRequestError) as shape:
        await client.completions.create(model="gpt-text", prompt={"not": "a prompt"})  # type: ignore[arg-type]
    assert "prompt" in shape.value.message
    with pytest.raises(openai.BadRequestError) as unserved:
        await client.completions.create(model="claude", prompt=PROMPT)
    assert unserved.value.body == {
        "message": "model 'claude' is not served on /v1/completions; it is served on "
        "/v1/chat/completions, /v1/responses, /v1/messages, /v1/messages/count_tokens",
        "type": "invalid_request_error",
        "param": "model",
        "code": None,
    }
    assert hosted.emulator.requests == []

    with pytest.raises(openai.BadRequestError) as rejected:
        await client.completions.create(model="rejected", prompt=PROMPT, suffix="!")
    assert "suffix is not supported with this model" in rejected.value.message
    [row] = await hosted.gateway.attempts(rejected.value.response.headers["x-request-id"])
    assert (row.status, row.upstream, row.endpoint) == (
        "failed",
        "openai/openai-error-400",
        COMPLETIONS,
    )
    [sent] = hosted.emulator.requests
    assert sent.body["suffix"] == "!"


async def test_only_completions_parameters_leave_the_gateway(hosted: Hosted) -> None:
    """litellm's options, kvgate's own members and chat's reach no provider; the listed
    models say which serve completions."""
    async with hosted.gateway.http(hosted.key) as http:
        reply = await http.post(
            COMPLETIONS,
            json={
                "model": "gpt-text",
                "prompt": PROMPT,
                "echo": False,
                "temperature": 0.2,
                "api_base": "http://attacker.example/v1",
                "mock_response": "not the provider's answer",
                "cache_salt": "tenant-salt",
                "metadata": {"interaction_id": "conv-1"},
                "messages": MESSAGES,
            },
        )
        assert reply.status_code == 200, reply.text
        listed = {m["id"]: m["endpoints"] for m in (await http.get("/v1/models")).json()["data"]}
    [sent] = hosted.emulator.requests
    assert sent.body == {
        "model": "openai-completion",
        "prompt": PROMPT,
        "echo": False,
        "temperature": 0.2,
    }
    assert set(sent.body) <= COMPLETION_PARAMETERS | {"model"}
    assert COMPLETIONS in listed["gpt-text"] and COMPLETIONS in listed["deepseek-text"]
    assert COMPLETIONS not in listed["claude"]
