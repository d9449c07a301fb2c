"""Which hosted providers speak OpenAI's wire themselves, and where (no litellm needed).

    OPENAI_WIRE_BASES     litellm's default ``api_base`` of each provider that serves
                          OpenAI's ``/chat/completions`` (read from litellm's own source;
                          ``hosted_vllm`` has none: it needs an ``api_base``)
    COMPLETION_PROVIDERS  those that serve the legacy ``/completions`` as well: OpenAI,
                          DeepSeek (its beta base), xAI, Together, Fireworks, OpenRouter and
                          any vLLM/SGLang/TGI server; Mistral, Groq and Moonshot serve chat only

A target's ``via: litellm`` sends its chat through litellm; its completions, which litellm
does not serve for the gateway, still go over the provider's own wire.
"""

from __future__ import annotations

from gateway.config import ProviderTarget

OPENAI_WIRE_BASES: dict[str, str | None] = {
    "openai": "https://api.openai.com/v1",
    "deepseek": "https://api.deepseek.com/beta",
    "xai": "https://api.x.ai/v1",
    "mistral": "https://api.mistral.ai/v1",
    "moonshot": "https://api.moonshot.ai/v1",
    "together_ai": "https://api.together.ai/v1",
    "fireworks_ai": "https://api.fireworks.ai/inference/v1",
    "groq": "https://api.groq.com/openai/v1",
    "openrouter": "https://openrouter.ai/api/v1",
    "hosted_vllm": None,
}
COMPLETION_PROVIDERS = frozenset(
    {"openai", "deepseek", "xai", "together_ai", "fireworks_ai", "openrouter", "hosted_vllm"}
)


def openai_base(target: ProviderTarget) -> str | None:
    """Where the target serves OpenAI's wire; None for a provider that does not speak it."""
    if target.provider not in OPENAI_WIRE_BASES:
        return None
    return target.base_url or OPENAI_WIRE_BASES[target.provider]


def speaks_chat(target: ProviderTarget) -> bool:
    """Whether the target's chat goes over its provider's own wire (not through litellm)."""
    return target.via != "litellm" and openai_base(target) is not None


def speaks_completions(target: ProviderTarget) -> bool:
    """Whether the target serves ``/v1/completions`` (always over its own wire)."""
    return target.provider in COMPLETION_PROVIDERS and openai_base(target) is not None
