"""What leaves the gateway for litellm: the OpenAI chat parameters of the body, and the
target's own model, base and key; never litellm options a client slipped into the body."""

from __future__ import annotations

from gateway.config import ProviderTarget
from gateway.upstream.providers import CHAT_PARAMETERS, NO_KEY, ProviderRequest, Providers

MESSAGES = [{"role": "user", "content": "hi"}]
# litellm reads these as its own options when they come as keyword arguments.
SLIPPED = {
    "api_base": "http://attacker.example",
    "base_url": "http://attacker.example/v1",
    "api_key": "sk-attacker",
    "mock_response": "an answer no provider gave",
    "custom_llm_provider": "openai",
    "aws_access_key_id": "AKIA…",
    "vertex_credentials": "{}",
    "litellm_logging_obj": None,
    "timeout": 99999,
    "num_retries": 5,
    "extra_headers": {"x-forwarded-for": "1.2.3.4"},
}


def arguments(
    target: ProviderTarget, body: dict[str, object], key: str | None
) -> dict[str, object]:
    request = ProviderRequest(target=target, body=body, api_key=key, stream=False)
    return Providers().arguments(request)


def test_litellm_options_in_a_body_never_reach_litellm() -> None:
    target = ProviderTarget(litellm_model="openai/gpt-4.1", api_base="http://provider.test/v1")
    body = {"model": "m", "messages": MESSAGES, "temperature": 0.2, "user": "u-1", **SLIPPED}
    got = arguments(target, body, "sk-operator")
    assert got == {
        "messages": MESSAGES,
        "temperature": 0.2,
        "user": "u-1",
        "model": "openai/gpt-4.1",
        "api_key": "sk-operator",
        "timeout": target.timeout_s,
        "num_retries": 0,
        "max_retries": 0,
        "drop_params": True,
        "api_base": "http://provider.test/v1",
    }


def test_without_a_base_or_key_none_is_taken_from_the_body() -> None:
    """A target with no api_base goes to the provider's own endpoint; with no key, the
    placeholder (never the client's, never one from the environment)."""
    target = ProviderTarget(litellm_model="anthropic/claude-sonnet-4-5")
    got = arguments(target, {"messages": MESSAGES, **SLIPPED}, None)
    assert "api_base" not in got and "base_url" not in got and "mock_response" not in got
    assert got["api_key"] == NO_KEY


def test_every_openai_chat_parameter_passes() -> None:
    target = ProviderTarget(litellm_model="openai/gpt-4.1")
    body = {name: f"value of {name}" for name in CHAT_PARAMETERS}
    got = arguments(target, body, "sk-operator")
    assert {name: got[name] for name in CHAT_PARAMETERS} == body
