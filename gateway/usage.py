"""Token usage in four disjoint classes, and the normalisers that produce it.

Every wire convention is turned into the same `Usage`, so that nothing downstream has to
know whether cached tokens were counted inside the prompt (OpenAI, vLLM) or on top of it
(Anthropic). The invariants live here:

- the four classes are disjoint and non-negative;
- ``prompt_tokens = uncached + cache_read + cache_write`` (derived, never stored);
- a count the upstream did not report is not invented: ``source`` says where it came from;
- ``cache_write_1h_tokens`` is the part of ``cache_write_tokens`` written with a 1-hour
  lifetime (Anthropic prices those higher); it is never a fifth class.

Conventions, and why each needs its own reading:

    OpenAI, vLLM    cached INSIDE prompt_tokens (prompt_tokens_details.cached_tokens)
    Responses API   cached INSIDE input_tokens (input_tokens_details.cached_tokens)
    Anthropic       cache reads and writes ON TOP of input_tokens; writes split 5m / 1h
    DeepSeek        prompt_cache_hit_tokens + prompt_cache_miss_tokens = prompt_tokens
    Gemini          cachedContentTokenCount INSIDE promptTokenCount; thoughts are output
    OpenRouter      OpenAI's, plus prompt_tokens_details.cache_write_tokens (also inside)
    litellm         every provider mapped to OpenAI's: reads and writes INSIDE prompt_tokens

``openai_wire(provider)`` names the reading of each provider served on OpenAI's chat wire
without litellm (gateway/serving/chatwire.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pricing.tokens import TokenClasses

CHARS_PER_TOKEN = 4  # only for estimates when an upstream reported no usage


class UsageSource(StrEnum):
    REPORTED = "reported"
    ESTIMATED = "estimated"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Usage(TokenClasses):
    """Tokens of one request, split into the classes that are priced differently."""

    source: UsageSource = UsageSource.REPORTED
    cache_write_1h_tokens: int = 0

    def __post_init__(self) -> None:
        for name in (
            "uncached_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "output_tokens",
            "cache_write_1h_tokens",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if self.cache_write_1h_tokens > self.cache_write_tokens:
            raise ValueError("cache_write_1h_tokens is part of cache_write_tokens, not more")

    @property
    def total_tokens(self) -> int:
        """Prompt and output tokens together."""
        return self.prompt_tokens + self.output_tokens

    @classmethod
    def missing(cls) -> Usage:
        """The usage of an answer that reported none: no tokens, source MISSING."""
        return cls(source=UsageSource.MISSING)

    @classmethod
    def estimated(cls, prompt_chars: int, output_tokens: int) -> Usage:
        """A guess for an answer that reported no usage: a token per ``CHARS_PER_TOKEN``
        characters of prompt, and the output tokens seen."""
        return cls(
            uncached_tokens=prompt_chars // CHARS_PER_TOKEN,
            output_tokens=output_tokens,
            source=UsageSource.ESTIMATED,
        )


def _count(value: Any) -> int:
    """A token count from a wire value; absent or malformed counts as zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0  # NaN and infinities: Python's json reads them
    return max(int(value), 0)


def _inside(prompt: int, cached: int, output: int) -> Usage:
    """Cached tokens counted inside the prompt (at most all of it); the rest uncached."""
    cached = min(cached, prompt)
    return Usage(uncached_tokens=prompt - cached, cache_read_tokens=cached, output_tokens=output)


def from_openai(usage: Mapping[str, Any] | None) -> Usage:
    """OpenAI/vLLM convention: cached tokens are counted INSIDE ``prompt_tokens``.

    vLLM's ``created_cache_tokens`` are tokens it computed and then cached; they cost the
    full prefill, so they stay uncached here.
    """
    if not usage:
        return Usage.missing()
    prompt = _count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details") or {}
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    return _inside(prompt, cached, _count(usage.get("completion_tokens")))


def from_responses(usage: Mapping[str, Any] | None) -> Usage:
    """OpenAI's Responses API: cached tokens INSIDE ``input_tokens``
    (``input_tokens_details.cached_tokens``); reasoning tokens are inside ``output_tokens``.

    vLLM's ``input_tokens_details.cache_write_tokens`` are tokens it computed and then
    cached (as ``created_cache_tokens`` on chat): the full prefill, so uncached here.
    """
    if not usage:
        return Usage.missing()
    prompt = _count(usage.get("input_tokens"))
    details = _mapping(usage.get("input_tokens_details"))
    return _inside(prompt, _count(details.get("cached_tokens")), _count(usage.get("output_tokens")))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _writes(total: Any, breakdown: Mapping[str, Any]) -> tuple[int, int]:
    """(all cache writes, 1-hour writes) from a total and a 5m/1h breakdown, either optional.

    The breakdown wins when it says more than the total: a stream can carry the breakdown in
    one event and an older total in another.
    """
    five = _count(breakdown.get("ephemeral_5m_input_tokens"))
    hour = _count(breakdown.get("ephemeral_1h_input_tokens"))
    return max(_count(total), five + hour), hour


def from_anthropic(usage: Mapping[str, Any] | None) -> Usage:
    """Anthropic convention: cache reads and writes are counted ON TOP of ``input_tokens``."""
    if not usage:
        return Usage.missing()
    writes, hour = _writes(
        usage.get("cache_creation_input_tokens"), _mapping(usage.get("cache_creation"))
    )
    return Usage(
        uncached_tokens=_count(usage.get("input_tokens")),
        cache_read_tokens=_count(usage.get("cache_read_input_tokens")),
        cache_write_tokens=writes,
        output_tokens=_count(usage.get("output_tokens")),
        cache_write_1h_tokens=hour,
    )


def from_vllm_anthropic(usage: Mapping[str, Any] | None) -> Usage:
    """vLLM's ``/v1/messages``: Anthropic's convention (reads and "creations" ON TOP of
    ``input_tokens``), where ``cache_creation_input_tokens`` are vLLM's created cache
    tokens: computed in full, so billed as uncached input, never as cache writes."""
    read = from_anthropic(usage)
    if read.source is UsageSource.MISSING:
        return read
    return Usage(
        uncached_tokens=read.uncached_tokens + read.cache_write_tokens,
        cache_read_tokens=read.cache_read_tokens,
        output_tokens=read.output_tokens,
    )


def from_deepseek(usage: Mapping[str, Any] | None) -> Usage:
    """DeepSeek convention: hits and misses split ``prompt_tokens``; writes are not billed."""
    if not usage:
        return Usage.missing()
    if "prompt_cache_hit_tokens" not in usage:
        return from_openai(usage)
    prompt = _count(usage.get("prompt_tokens"))
    hits = _count(usage.get("prompt_cache_hit_tokens"))
    return _inside(prompt, hits, _count(usage.get("completion_tokens")))


def _either(usage: Mapping[str, Any], camel: str, snake: str) -> int:
    return _count(usage.get(camel, usage.get(snake)))


def from_gemini(usage: Mapping[str, Any] | None) -> Usage:
    """Gemini ``usageMetadata`` (camelCase on the wire, snake_case in the SDKs).

    Cached content is inside ``promptTokenCount``; tool-use prompt tokens are input on top of
    it; thinking tokens are billed as output, beside the candidates.
    """
    if not usage:
        return Usage.missing()
    prompt = _either(usage, "promptTokenCount", "prompt_token_count")
    prompt += _either(usage, "toolUsePromptTokenCount", "tool_use_prompt_token_count")
    cached = min(_either(usage, "cachedContentTokenCount", "cached_content_token_count"), prompt)
    output = _either(usage, "candidatesTokenCount", "candidates_token_count")
    output += _either(usage, "thoughtsTokenCount", "thoughts_token_count")
    return Usage(uncached_tokens=prompt - cached, cache_read_tokens=cached, output_tokens=output)


def _inside_prompt(prompt: int, read: int, write: int, hour: int, output: int) -> Usage:
    """Reads and writes counted inside ``prompt``: cap them so the classes stay disjoint."""
    read = min(read, prompt)
    write = min(write, prompt - read)
    return Usage(
        uncached_tokens=prompt - read - write,
        cache_read_tokens=read,
        cache_write_tokens=write,
        output_tokens=output,
        cache_write_1h_tokens=min(hour, write),
    )


def from_openrouter(usage: Mapping[str, Any] | None) -> Usage:
    """OpenRouter: OpenAI's convention, with cache writes also inside ``prompt_tokens``."""
    if not usage:
        return Usage.missing()
    details = _mapping(usage.get("prompt_tokens_details"))
    return _inside_prompt(
        _count(usage.get("prompt_tokens")),
        _count(details.get("cached_tokens")),
        _count(details.get("cache_write_tokens")),
        0,
        _count(usage.get("completion_tokens")),
    )


def from_litellm(usage: Mapping[str, Any] | None) -> Usage:
    """litellm's usage, whatever the provider: reads and writes both inside ``prompt_tokens``.

    litellm maps Anthropic's on-top counts into OpenAI's shape (adding them to
    ``prompt_tokens``) and keeps the originals beside them; the originals are the fallback
    where a provider's mapping leaves the details empty (DeepSeek's hit count, Anthropic's
    raw cache fields).
    """
    if not usage:
        return Usage.missing()
    details = _mapping(usage.get("prompt_tokens_details"))
    read = details.get("cached_tokens")
    if not read:
        read = usage.get("cache_read_input_tokens") or usage.get("prompt_cache_hit_tokens")
    write = details.get("cache_write_tokens")
    if write is None:
        write = details.get("cache_creation_tokens", usage.get("cache_creation_input_tokens"))
    write, hour = _writes(write, _mapping(details.get("cache_creation_token_details")))
    return _inside_prompt(
        _count(usage.get("prompt_tokens")),
        _count(read),
        write,
        hour,
        _count(usage.get("completion_tokens")),
    )


# The providers on OpenAI's chat wire whose usage is not OpenAI's own (the rest: from_openai).
OPENAI_WIRE_CONVENTIONS: dict[str, Callable[[Mapping[str, Any] | None], Usage]] = {
    "deepseek": from_deepseek,
    "openrouter": from_openrouter,
}


def openai_wire(provider: str) -> Callable[[Mapping[str, Any] | None], Usage]:
    """The normaliser of a provider's usage on OpenAI's chat wire (litellm prefix names it)."""
    return OPENAI_WIRE_CONVENTIONS.get(provider, from_openai)


def to_openai(usage: Usage) -> dict[str, Any]:
    """The OpenAI wire form of a usage, as the gateway returns it to clients."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
    }
