"""Tenant isolation on the engine itself: every tenant's requests carry its own salt, and
a client's ``cache_salt`` is folded in under the tenant's, so it can never name its way
into another tenant's cache. ``tiny-solo`` has one replica: a prompt's blocks are there."""

from __future__ import annotations

from collections.abc import Callable

import anthropic
import openai
import pytest

from tests.vllm.conftest import ExactStack
from tests.vllm.replicas import text


def cached(client: openai.OpenAI, content: str, salt: str | None = None) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of one request to the single-replica deployment."""
    reply = client.chat.completions.create(
        model="tiny-solo",
        messages=[{"role": "user", "content": content}],
        max_tokens=2,
        temperature=0,
        extra_body={"cache_salt": salt} if salt else None,
    )
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0, reply.usage.prompt_tokens


def test_another_tenant_gets_nothing_from_a_prompt_the_first_one_cached(
    stack: ExactStack,
) -> None:
    alpha, beta = stack.client("alpha"), stack.client("beta")
    prompt = text(401, 200)
    assert cached(alpha, prompt)[0] == 0
    hits, prompt_tokens = cached(alpha, prompt)
    assert hits == (prompt_tokens - 1) // 32 * 32 > 0
    assert cached(beta, prompt) == (0, prompt_tokens)
    # Nor did beta's request disturb alpha's blocks.
    assert cached(alpha, prompt) == (hits, prompt_tokens)


def test_a_client_chosen_salt_never_reaches_another_tenants_cache(stack: ExactStack) -> None:
    alpha, beta = stack.client("alpha"), stack.client("beta")
    prompt = text(402, 200)
    assert cached(alpha, prompt, salt="team-x")[0] == 0
    hits, _ = cached(alpha, prompt, salt="team-x")
    assert hits > 0
    # The same client salt from another tenant, or no salt from the same one: no hits.
    assert cached(beta, prompt, salt="team-x")[0] == 0
    assert cached(alpha, prompt)[0] == 0
    # A raw salt sent straight to vLLM is not the salt kvgate sent on alpha's behalf.
    replica = openai.OpenAI(
        base_url=stack.backend.replicas[0].url + "/v1", api_key="unused", max_retries=0
    )
    direct = replica.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=2,
        temperature=0,
        extra_body={"cache_salt": "team-x"},
    )
    assert direct.usage is not None and direct.usage.prompt_tokens_details is not None
    assert direct.usage.prompt_tokens_details.cached_tokens == 0


def responses_cached(stack: ExactStack, tenant: str, content: str) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of one ``responses.create``."""
    reply = stack.client(tenant).responses.create(
        model="tiny-solo", input=content, max_output_tokens=2, temperature=0
    )
    assert reply.usage is not None
    return reply.usage.input_tokens_details.cached_tokens, reply.usage.input_tokens


def messages_cached(stack: ExactStack, tenant: str, content: str) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of one Anthropic ``messages.create``."""
    claude = anthropic.Anthropic(
        base_url=stack.gateway.url, api_key=stack.keys[tenant], max_retries=0
    )
    reply = claude.messages.create(
        model="tiny-solo", max_tokens=2, messages=[{"role": "user", "content": content}]
    )
    cached = reply.usage.cache_read_input_tokens or 0
    return cached, reply.usage.input_tokens + cached


@pytest.mark.parametrize(
    ("ask", "seed"),
    [(responses_cached, 403), (messages_cached, 404)],
    ids=["responses", "messages"],
)
def test_the_responses_and_messages_wires_carry_the_tenants_salt_too(
    stack: ExactStack, ask: Callable[[ExactStack, str, str], tuple[int, int]], seed: int
) -> None:
    prompt = text(seed, 200)
    assert ask(stack, "alpha", prompt)[0] == 0
    hits, prompt_tokens = ask(stack, "alpha", prompt)
    assert hits == (prompt_tokens - 1) // 32 * 32 > 0
    assert ask(stack, "beta", prompt) == (0, prompt_tokens)
    assert ask(stack, "alpha", prompt) == (hits, prompt_tokens)
