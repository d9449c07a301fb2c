"""Conformance: each provider convention's recorded responses, through litellm's real code
path against the loopback emulator, come out in the right classes at the right cost.

Every expected value is computed by hand from the fixture (rates are USD per million):
a wrong class shows up as a wrong cost to the nano-dollar.
"""

from dataclasses import dataclass
from decimal import Decimal

import pytest

from gateway.config import ProviderTarget
from gateway.upstream.providers import ProviderRequest, Providers
from gateway.usage import Usage, UsageSource
from pricing.book import Price
from pricing.cost import compute
from tests.providers.emulator import Emulator
from tests.providers.prices import (
    DEEPSEEK,
    GEMINI,
    GPT,
    OPENROUTER_SONNET,
    SONNET,
    SONNET_PRIORITY_CONTRACT,
)

D = Decimal
BODY = {
    "model": "client-name",
    "max_tokens": 64,
    "cache_salt": "tenant-salt",
    "metadata": {"interaction_id": "conv-1"},
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
}


@dataclass(frozen=True)
class Case:
    name: str
    litellm_prefix: str
    api_path: str
    price: Price
    usage: Usage
    total: Decimal
    tier: str | None = None
    stream: bool = True


CASES = [
    # 176 x 2 + 1024 x 0.50 + 30 x 8: cached tokens are inside the 1200, not on top of them.
    Case(
        "openai-cached", "openai", "/v1", GPT, Usage(176, 1024, 0, 30), D("0.001104000"), "default"
    ),
    # The response says priority: 2000 x 3.50 + 100 x 14.
    Case(
        "openai-priority",
        "openai",
        "/v1",
        GPT,
        Usage(2000, 0, 0, 100),
        D("0.008400000"),
        "priority",
    ),
    # 50 x 3 + 2000 x 0.30 + 80 x 15: reads at the cache-read rate, not the input rate.
    Case(
        "anthropic-cache-read",
        "anthropic",
        "",
        SONNET,
        Usage(50, 2000, 0, 80),
        D("0.001950000"),
        "standard",
    ),
    # 20 x 3 + (1000 x 3.75 + 500 x 6) + 60 x 15; in the stream the writes come only in
    # message_start, and must not be lost.
    Case(
        "anthropic-cache-write",
        "anthropic",
        "",
        SONNET,
        Usage(20, 0, 1500, 60, cache_write_1h_tokens=500),
        D("0.007710000"),
        "standard",
    ),
    # Served at Priority Tier (said in message_start's usage, which litellm's stream drops):
    # 1000 x 3.90 + 50 x 19.50 at the contract's priority rates, not 1000 x 3 + 50 x 15.
    Case(
        "anthropic-priority",
        "anthropic",
        "",
        SONNET_PRIORITY_CONTRACT,
        Usage(1000, 0, 0, 50),
        D("0.004875000"),
        "priority",
    ),
    # 232 x 0.27 + 768 x 0.07 + 50 x 1.10; the stream has only hit/miss counts.
    Case(
        "deepseek-cache-hit", "deepseek", "/v1", DEEPSEEK, Usage(232, 768, 0, 50), D("0.000171400")
    ),
    # 3808 x 1.25 + 8192 x 0.125 + 200 x 10.
    Case("gemini-cached", "gemini", "/v1beta", GEMINI, Usage(3808, 8192, 0, 200), D("0.007784000")),
    # 250,000 prompt tokens > 200k: all at long-context rates, thoughts billed as output:
    # 50,000 x 2.50 + 200,000 x 0.25 + (100 + 50) x 15.
    Case(
        "gemini-long-context",
        "gemini",
        "/v1beta",
        GEMINI,
        Usage(50_000, 200_000, 0, 150),
        D("0.177250000"),
        stream=False,
    ),
    # 500 x 3 + 2000 x 0.30 + 500 x 3.75 + 40 x 15: reads and writes inside prompt_tokens.
    Case(
        "openrouter-cache",
        "openrouter",
        "/v1",
        OPENROUTER_SONNET,
        Usage(500, 2000, 500, 40),
        D("0.004575000"),
    ),
]


def target(case: Case, url: str) -> ProviderTarget:
    return ProviderTarget(
        litellm_model=f"{case.litellm_prefix}/{case.name}", api_base=url + case.api_path
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_complete(case: Case, providers: Providers, emulator: tuple[Emulator, str]) -> None:
    _fake, url = emulator
    reply = await providers.complete(ProviderRequest(target(case, url), BODY, "sk-test"))
    assert reply.usage == case.usage
    assert reply.service_tier == case.tier
    assert compute(reply.usage, case.price, tier=reply.service_tier).total == case.total
    assert reply.finish_reason == "stop"
    assert "usage" not in reply.body  # the gateway answers with its own


@pytest.mark.parametrize("case", [c for c in CASES if c.stream], ids=lambda c: c.name)
async def test_stream(case: Case, providers: Providers, emulator: tuple[Emulator, str]) -> None:
    _fake, url = emulator
    request = ProviderRequest(target(case, url), BODY, "sk-test", stream=True)
    stream = await providers.open_stream(request)
    events = [event async for event in stream.events()]
    await stream.close()
    usage = stream.usage()
    assert usage == case.usage
    assert stream.service_tier == case.tier
    assert compute(usage, case.price, tier=stream.service_tier).total == case.total
    assert stream.finish_reason == "stop"
    assert all(event.startswith(b"data: {") and b'"usage"' not in event for event in events)


async def test_a_stream_without_usage_is_estimated_and_marked_so(
    providers: Providers, emulator: tuple[Emulator, str]
) -> None:
    """litellm counts tokens itself when a provider sends none; that is not a report."""
    fake, url = emulator
    case_target = ProviderTarget(litellm_model="openai/openai-no-usage", api_base=url + "/v1")  # type: ignore[arg-type]
    stream = await providers.open_stream(ProviderRequest(case_target, BODY, None, stream=True))
    chunks = [event async for event in stream.events()]
    # 44 characters of prompt / 4; seven content chunks ("Paris", " is", ... ".").
    assert stream.usage() == Usage(11, 0, 0, 7, source=UsageSource.ESTIMATED)
    assert len(chunks) == 9  # role chunk, seven words, finish chunk
    # No key named: a placeholder, never a key litellm found in the environment.
    assert fake.requests[-1].headers["Authorization"] == "Bearer kvgate-no-key-configured"


async def test_vllm_and_gateway_fields_are_never_sent(
    providers: Providers, emulator: tuple[Emulator, str]
) -> None:
    fake, url = emulator
    case = CASES[0]
    await providers.complete(ProviderRequest(target(case, url), BODY, "sk-test"))
    sent = fake.requests[-1]
    assert "cache_salt" not in sent.body and "metadata" not in sent.body
    assert sent.body["model"] == "openai-cached"
    assert sent.headers["Authorization"] == "Bearer sk-test"


async def test_anthropic_opt_in_marks_tools_and_system_prompt(
    providers: Providers, emulator: tuple[Emulator, str]
) -> None:
    fake, url = emulator
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    marked = ProviderTarget(
        litellm_model="anthropic/anthropic-cache-write",
        api_base=url,
        cache_control=True,
        cache_ttl="1h",
    )  # type: ignore[arg-type]
    await providers.complete(ProviderRequest(marked, {**BODY, "tools": [tool]}, "sk-test"))
    sent = fake.requests[-1].body
    assert sent["system"] == [
        {
            "type": "text",
            "text": "You are terse.",
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        }
    ]
    assert sent["tools"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert "cache_control" not in str(sent["messages"])
    assert fake.requests[-1].headers["x-api-key"] == "sk-test"

    plain = ProviderTarget(litellm_model="anthropic/anthropic-cache-write", api_base=url)  # type: ignore[arg-type]
    await providers.complete(ProviderRequest(plain, BODY, "sk-test"))
    assert "cache_control" not in str(fake.requests[-1].body)


def test_cache_control_is_refused_for_providers_that_would_reject_it() -> None:
    with pytest.raises(ValueError, match="Anthropic-family"):
        ProviderTarget(litellm_model="openai/gpt-4.1", cache_control=True)


@pytest.mark.parametrize(
    ("case", "status", "retryable"),
    [
        ("anthropic/anthropic-error-500", 502, True),
        ("openai/openai-error-429", 429, True),
    ],
)
async def test_provider_errors_keep_their_status(
    case: str, status: int, retryable: bool, providers: Providers, emulator: tuple[Emulator, str]
) -> None:
    from gateway.upstream.providers import ProviderFailure

    _fake, url = emulator
    base = url + ("/v1" if case.startswith("openai") else "")
    failing = ProviderTarget(litellm_model=case, api_base=base)  # type: ignore[arg-type]
    for stream in (False, True):
        with pytest.raises(ProviderFailure) as caught:
            if stream:
                await providers.open_stream(ProviderRequest(failing, BODY, "k", stream=True))
            else:
                await providers.complete(ProviderRequest(failing, BODY, "k"))
        assert (caught.value.status, caught.value.retryable) == (status, retryable)
