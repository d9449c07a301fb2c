"""What a chat body and a chat answer hold for the hosted providers, wherever the chat goes
(the provider's own wire, gateway/serving/chatwire.py, or litellm's completion): the
members a client may send on, the cache marks of Anthropic models, the service tier an
answer reports, and the prompt guessed for a stream that reports no usage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The OpenAI chat parameters a client may send on to a provider. litellm takes its own
# options as keyword arguments beside them (api_base, api_key, mock_response,
# custom_llm_provider, credentials of clouds…): passed from a body, a client could send the
# operator's key to a host of its choosing or get an answer no provider gave. Only these
# leave the gateway; anything else in the body is dropped, as litellm's drop_params would.
CHAT_PARAMETERS = frozenset(
    {
        "messages",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
CHARS_PER_TOKEN = 4  # only for estimates when a provider reported no usage
GENERATED = ("content", "tool_calls", "reasoning_content", "function_call")


def service_tier(data: Mapping[str, Any]) -> str | None:
    """The tier the provider says it served (OpenAI: top level; Anthropic: inside usage)."""
    usage = data.get("usage")
    tier = data.get("service_tier") or (
        usage.get("service_tier") if isinstance(usage, dict) else None
    )
    return str(tier) if tier else None


def cache_marks(ttl: str) -> dict[str, str]:
    """The ``cache_control`` for a TTL: ephemeral, with ``ttl`` unless it is the default 5m."""
    return {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}


def mark_stable_prefix(body: dict[str, Any], ttl: str) -> None:
    """Mark the end of the tools and of the last system message with ``cache_control``.

    Anthropic caches everything up to a marked block; tools come first and the system
    prompt next, so these two marks cover the part that repeats across requests.
    """
    marks = cache_marks(ttl)
    tools = body.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[-1], dict):
        body["tools"] = [*tools[:-1], {**tools[-1], "cache_control": marks}]
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") != "system":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts: list[Any] = [{"type": "text", "text": content}]
        elif isinstance(content, list) and content and isinstance(content[-1], dict):
            parts = list(content)
        else:
            return
        parts[-1] = {**parts[-1], "cache_control": marks}
        body["messages"] = [
            *messages[:index],
            {**message, "content": parts},
            *messages[index + 1 :],
        ]
        return


def prompt_estimate(body: Mapping[str, Any]) -> int:
    """Prompt tokens guessed from the messages' text, for streams that report no usage."""
    chars = 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(
                len(p.get("text", ""))
                for p in content
                if isinstance(p, dict) and isinstance(p.get("text", ""), str)
            )
    return chars // CHARS_PER_TOKEN


def dump(value: Any) -> dict[str, Any]:
    """A pydantic model (litellm's) or a mapping as a plain dict."""
    dumped = value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else dict(value)
    return dumped if isinstance(dumped, dict) else {}
