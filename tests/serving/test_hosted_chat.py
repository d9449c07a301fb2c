"""Hosted chat on both paths, in-process: the official ``openai`` client → the gateway →
tests/providers' emulator, once over the provider's own OpenAI wire (``via: auto``) and once
through litellm (``via: litellm``), against the same recorded fixtures.

Each provider's fixture is sent to both paths and the records must be the same in every
token class, every cost to the nano-dollar, status, finish reason, tier and usage source;
the client sees the same text, finish reason and billed usage. Expected values are the
conformance cases' (tests/providers/test_conformance.py), computed by hand from the
fixtures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import openai
import pytest

from gateway.db.models import RequestRow
from gateway.upstream.providers import CHAT_PARAMETERS
from tests.factories import litellm
from tests.providers.emulator import Emulator
from tests.providers.prices import DEEPSEEK, GPT, OPENROUTER_SONNET
from tests.serving.conftest import Harness
from tests.support.inprocess import Gateway
from tests.support.processes import free_port

D = Decimal
KEY = "sk-openai-test"
VIAS = ("auto", "litellm")
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the capital of France?"},
]
TEXT = "Paris is the capital of France."


@dataclass(frozen=True)
class Case:
    name: str
    prefix: str
    price_model: str
    tokens: tuple[int, int, int, int]  # uncached, cache read, cache write, output
    total: Decimal
    tier: str | None


CASES = [
    Case("openai-cached", "openai", GPT.model, (176, 1024, 0, 30), D("0.001104000"), "default"),
    Case("openai-priority", "openai", GPT.model, (2000, 0, 0, 100), D("0.008400000"), "priority"),
    Case(
        "deepseek-cache-hit", "deepseek", DEEPSEEK.model, (232, 768, 0, 50), D("0.000171400"), None
    ),
    Case(
        "openrouter-cache",
        "openrouter",
        OPENROUTER_SONNET.model,
        (500, 2000, 500, 40),
        D("0.004575000"),
        None,
    ),
]


@dataclass
class Hosted:
    emulator: Emulator
    gateway: Gateway
    key: str
    made: openai.AsyncOpenAI | None = None

    def client(self) -> openai.AsyncOpenAI:
        """The test's one official client (closed with the test)."""
        if self.made is None:
            self.made = self.gateway.client(self.key)
        return self.made


@pytest.fixture
async def hosted(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hosted]:
    monkeypatch.setenv("KVGATE_TEST_OPENAI_KEY", KEY)
    emulator = Emulator(event_delay_s=0.02)  # so that a client can leave a stream half way
    url = await harness.serve(emulator.app())
    harness.add_prices(GPT, DEEPSEEK, OPENROUTER_SONNET)
    base = {"api_base": url + "/v1", "api_key_env": "KVGATE_TEST_OPENAI_KEY"}
    refused = {**base, "api_base": f"http://127.0.0.1:{free_port()}/v1"}
    served = {"litellm_model": "openai/openai-cached", **base, "price_model": GPT.model}
    entries = []
    for via in VIAS:
        for case in CASES:
            model = f"{case.prefix}/{case.name}"
            entries.append(litellm(f"{case.name}-{via}", model, **base, via=via, **_price(case)))
        gpt = {"price_model": GPT.model, "via": via}
        entries += [
            litellm(f"no-usage-{via}", "openai/openai-no-usage", **base, **gpt),
            litellm(f"failing-{via}", "openai/openai-error-500", **base, **gpt),
            litellm(
                f"retry-{via}",
                "openai/openai-error-500",
                **base,
                **gpt,
                fallbacks=[
                    {"litellm_model": "openai/openai-error-429", **base, "via": via},
                    {
                        "litellm_model": "openai/openai-cached",
                        **refused,
                        "price_model": GPT.model,
                        "via": via,
                    },
                    {**served, "via": via},
                ],
            ),
        ]
    gateway = await harness.gateway(*entries)
    made = Hosted(emulator, gateway, harness.tenant.key)
    yield made
    if made.made is not None:
        await made.made.close()


def _price(case: Case) -> dict[str, str]:
    return {"price_model": case.price_model}


def record(row: RequestRow) -> dict[str, Any]:
    """Everything a record says that both paths must agree on."""
    return {
        "attempt": row.attempt,
        "status": row.status,
        "upstream": row.upstream,
        "tokens": (
            row.uncached_tokens,
            row.cache_read_tokens,
            row.cache_write_tokens,
            row.cache_write_1h_tokens,
            row.output_tokens,
        ),
        "source": row.usage_source,
        "costs": (
            row.cost_uncached,
            row.cost_cache_read,
            row.cost_cache_write,
            row.cost_output,
            row.cost_total,
        ),
        "finish": row.finish_reason,
        "tier": row.service_tier,
        "price": row.price_id,
        "stream": row.stream,
        "endpoint": row.endpoint,
    }


async def _complete(hosted: Hosted, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    raw = await hosted.client().chat.completions.with_raw_response.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=64,
    )
    reply = raw.parse()
    assert reply.usage is not None
    seen = {
        "text": reply.choices[0].message.content,
        "finish": reply.choices[0].finish_reason,
        "usage": reply.usage.model_dump(include={"prompt_tokens", "completion_tokens"}),
        "extra": {k: (reply.usage.model_extra or {})[k] for k in ("cost", "usage_source")},
        "cached": reply.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
        if reply.usage.prompt_tokens_details
        else None,
        "cost_header": raw.headers["x-kvgate-cost"],
    }
    [row] = await hosted.gateway.attempts(raw.headers["x-request-id"])
    return seen, record(row)


async def _stream(hosted: Hosted, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    stream = await hosted.client().chat.completions.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    request_id = stream.response.headers["x-request-id"]
    chunks = [chunk async for chunk in stream]
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert all(c.usage is None for c in chunks[:-1])  # only the billed usage reaches the client
    seen = {
        "text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
        "finish": [c.choices[0].finish_reason for c in chunks if c.choices][-1],
        "usage": usage.model_dump(include={"prompt_tokens", "completion_tokens"}),
        "extra": {k: (usage.model_extra or {})[k] for k in ("cost", "usage_source")},
    }
    [row] = await hosted.gateway.attempts(request_id)
    return seen, record(row)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_both_paths_record_and_answer_the_same_for_each_convention(
    case: Case, hosted: Hosted
) -> None:
    """Same fixture, same record and the same billed answer, streamed and not."""
    for send in (_complete, _stream):
        wire_seen, wire_row = await send(hosted, f"{case.name}-auto")
        litellm_seen, litellm_row = await send(hosted, f"{case.name}-litellm")
        assert wire_row == litellm_row
        assert wire_seen == litellm_seen
        assert wire_row["tokens"] == (*case.tokens[:3], 0, case.tokens[3])
        assert (wire_row["costs"][-1], wire_row["tier"], wire_row["finish"]) == (
            case.total,
            case.tier,
            "stop",
        )
        assert wire_seen["text"].startswith("Paris is the capital")
        assert wire_seen["extra"] == {"cost": f"{case.total:f}", "usage_source": "reported"}


async def test_the_same_wire_sends_the_allowed_parameters_with_the_operators_key(
    hosted: Hosted,
) -> None:
    """Members litellm would take as its own options (api_base, mock_response…) and kvgate's
    own never reach the provider, on either path; the stream asks for usage."""
    smuggled = {
        "api_base": "http://attacker.example/v1",
        "mock_response": "not the provider's answer",
        "custom_llm_provider": "openai",
        "api_key": "sk-client",
        "cache_salt": "tenant-salt",
        "metadata": {"interaction_id": "conv-1"},
        "temperature": 0.2,
    }
    for via in VIAS:
        async with hosted.gateway.http(hosted.key) as http:
            for stream in (False, True):
                extra = {"stream": True} if stream else {}
                body = {"model": f"openai-cached-{via}", "messages": MESSAGES, **smuggled, **extra}
                reply = await http.post("/v1/chat/completions", json=body)
                assert reply.status_code == 200 and TEXT[:5] in reply.text
    allowed = CHAT_PARAMETERS | {"model", "stream", "stream_options"}
    assert len(hosted.emulator.requests) == 4
    for received in hosted.emulator.requests:
        assert set(received.body) <= allowed
        assert received.body["model"] == "openai-cached"
        assert received.body["temperature"] == 0.2
        assert received.headers["Authorization"] == f"Bearer {KEY}"
    wire_stream = hosted.emulator.requests[1].body
    assert (wire_stream["stream"], wire_stream["stream_options"]) == (True, {"include_usage": True})


@pytest.mark.parametrize("via", VIAS)
async def test_500_429_and_a_refused_connection_fail_over_before_the_first_byte(
    via: str, hosted: Hosted
) -> None:
    """Four targets: a 500, a 429, a closed port, then one that answers. The closed port is
    tried twice on the provider's own wire (a connection that fails before any byte is
    tried once more on the same target); litellm's connection error is not told apart."""
    for stream in (False, True):
        client = hosted.client()
        if stream:
            made = await client.chat.completions.create(
                model=f"retry-{via}",
                messages=MESSAGES,  # type: ignore[arg-type]
                stream=True,
            )
            request_id = made.response.headers["x-request-id"]
            text = "".join([c.choices[0].delta.content or "" async for c in made if c.choices])
        else:
            raw = await client.chat.completions.with_raw_response.create(
                model=f"retry-{via}",
                messages=MESSAGES,  # type: ignore[arg-type]
            )
            request_id = raw.headers["x-request-id"]
            text = raw.parse().choices[0].message.content or ""
        assert text == TEXT
        rows = await hosted.gateway.attempts(request_id)
        refused = 2 if via == "auto" else 1
        assert [(r.attempt, r.status, r.upstream, r.cost_total) for r in rows] == [
            (1, "failed", "openai/openai-error-500", D("0E-9")),
            (2, "failed", "openai/openai-error-429", D("0E-9")),
            *[(n, "failed", "openai/openai-cached", D("0E-9")) for n in range(3, 3 + refused)],
            (3 + refused, "completed", "openai/openai-cached", D("0.001104000")),
        ]
        assert all(r.error for r in rows[:-1])


@pytest.mark.parametrize("via", VIAS)
async def test_the_last_targets_failure_is_what_the_client_gets(via: str, hosted: Hosted) -> None:
    """A 500 from the only target: 502 to the client, one failed record, on both paths."""
    with pytest.raises(openai.APIStatusError) as caught:
        await hosted.client().chat.completions.create(
            model=f"failing-{via}",
            messages=MESSAGES,  # type: ignore[arg-type]
        )
    assert caught.value.status_code == 502
    [row] = await hosted.gateway.attempts(caught.value.response.headers["x-request-id"])
    assert (row.status, row.upstream) == ("failed", "openai/openai-error-500")


async def test_a_stream_without_usage_is_estimated_alike_on_both_paths(hosted: Hosted) -> None:
    """44 characters of prompt / 4 and the seven content chunks, marked estimated."""
    seen = [await _stream(hosted, f"no-usage-{via}") for via in VIAS]
    assert seen[0] == seen[1]
    assert seen[0][1]["tokens"] == (11, 0, 0, 0, 7)
    assert seen[0][1]["source"] == "estimated"
    assert seen[0][1]["costs"][-1] == D("0.000078000")  # 11 x 2 + 7 x 8


@pytest.mark.parametrize("via", VIAS)
async def test_a_client_that_leaves_a_stream_is_charged_the_tokens_so_far(
    via: str, hosted: Hosted
) -> None:
    """Nothing reported yet (usage comes last): the prompt estimated, the output relayed."""
    async with (
        hosted.gateway.http(hosted.key) as http,
        http.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": f"openai-cached-{via}", "messages": MESSAGES, "stream": True},
        ) as reply,
    ):
        request_id = reply.headers["x-request-id"]
        seen = 0
        async for line in reply.aiter_lines():
            seen += line.startswith("data: {")
            if seen == 3:
                break
    [row] = await hosted.gateway.attempts(request_id, count=1)
    assert (row.status, row.error, row.usage_source) == (
        "cancelled",
        "client disconnected",
        "estimated",
    )
    assert (row.uncached_tokens, row.cache_read_tokens) == (11, 0)
    assert 2 <= row.output_tokens < 30
    assert row.cost_total == (D(11 * 2) + D(row.output_tokens * 8)) / 10**6
