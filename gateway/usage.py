"""Token usage in four disjoint classes, and the normalisers that produce it.

Every wire convention is turned into the same `Usage`, so that nothing downstream has to
know whether cached tokens were counted inside the prompt (OpenAI, vLLM) or on top of it
(Anthropic). The invariants live here:

- the four classes are disjoint and non-negative;
- ``prompt_tokens = uncached + cache_read + cache_write`` (derived, never stored);
- a count the upstream did not report is not invented: ``source`` says where it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class UsageSource(StrEnum):
    REPORTED = "reported"
    ESTIMATED = "estimated"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one request, split into the classes that are priced differently."""

    uncached_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    source: UsageSource = UsageSource.REPORTED

    def __post_init__(self) -> None:
        for name in ("uncached_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")

    @property
    def prompt_tokens(self) -> int:
        return self.uncached_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @classmethod
    def missing(cls) -> Usage:
        return cls(source=UsageSource.MISSING)


def _count(value: Any) -> int:
    """A token count from a wire value; absent or malformed counts as zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(int(value), 0)


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
    cached = min(cached, prompt)
    return Usage(
        uncached_tokens=prompt - cached,
        cache_read_tokens=cached,
        output_tokens=_count(usage.get("completion_tokens")),
    )


def from_anthropic(usage: Mapping[str, Any] | None) -> Usage:
    """Anthropic convention: cache reads and writes are counted ON TOP of ``input_tokens``."""
    if not usage:
        return Usage.missing()
    return Usage(
        uncached_tokens=_count(usage.get("input_tokens")),
        cache_read_tokens=_count(usage.get("cache_read_input_tokens")),
        cache_write_tokens=_count(usage.get("cache_creation_input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
    )


def to_openai(usage: Usage) -> dict[str, Any]:
    """The OpenAI wire form of a usage, as the gateway returns it to clients."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
    }
