"""Each provider's raw usage, and litellm's mapping of it, in the four disjoint classes."""

import orjson
import pytest

from gateway.usage import (
    Usage,
    UsageSource,
    from_anthropic,
    from_deepseek,
    from_gemini,
    from_litellm,
    from_openrouter,
)
from tests.providers.emulator import FIXTURES


def fixture_usage(case: str, key: str = "usage") -> dict:  # type: ignore[type-arg]
    return orjson.loads((FIXTURES / f"{case}.json").read_bytes())[key]  # type: ignore[no-any-return]


def test_anthropic_5m_and_1h_writes_are_split_inside_cache_writes() -> None:
    usage = from_anthropic(fixture_usage("anthropic-cache-write"))
    assert usage == Usage(
        uncached_tokens=20,
        cache_read_tokens=0,
        cache_write_tokens=1500,
        output_tokens=60,
        cache_write_1h_tokens=500,
    )
    assert usage.prompt_tokens == 1520


def test_anthropic_breakdown_alone_still_counts_its_writes() -> None:
    usage = from_anthropic(
        {
            "input_tokens": 5,
            "output_tokens": 1,
            "cache_creation": {"ephemeral_5m_input_tokens": 7, "ephemeral_1h_input_tokens": 3},
        }
    )
    assert (usage.cache_write_tokens, usage.cache_write_1h_tokens) == (10, 3)


def test_deepseek_hits_and_misses_split_the_prompt() -> None:
    assert from_deepseek(fixture_usage("deepseek-cache-hit")) == Usage(232, 768, 0, 50)
    # Without hit/miss counts it is plain OpenAI convention.
    assert from_deepseek({"prompt_tokens": 9, "completion_tokens": 1}) == Usage(9, 0, 0, 1)


def test_gemini_cached_content_is_inside_the_prompt_and_thoughts_are_output() -> None:
    assert from_gemini(fixture_usage("gemini-long-context", "usageMetadata")) == Usage(
        uncached_tokens=50_000, cache_read_tokens=200_000, output_tokens=150
    )
    snake = {
        "prompt_token_count": 100,
        "cached_content_token_count": 60,
        "candidates_token_count": 5,
        "tool_use_prompt_token_count": 10,
    }
    assert from_gemini(snake) == Usage(50, 60, 0, 5)


def test_openrouter_reads_and_writes_are_both_inside_prompt_tokens() -> None:
    assert from_openrouter(fixture_usage("openrouter-cache")) == Usage(500, 2000, 500, 40)


def test_litellm_anthropic_mapping_is_not_counted_twice() -> None:
    """litellm adds Anthropic's cache counts into prompt_tokens: they must come out again."""
    mapped = {
        "prompt_tokens": 1520,
        "completion_tokens": 60,
        "prompt_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 1500,
            "cache_creation_token_details": {
                "ephemeral_5m_input_tokens": 1000,
                "ephemeral_1h_input_tokens": 500,
            },
        },
        "cache_creation_input_tokens": 1500,
        "cache_read_input_tokens": 0,
    }
    assert from_litellm(mapped) == Usage(20, 0, 1500, 60, cache_write_1h_tokens=500)


def test_litellm_falls_back_to_the_providers_own_fields() -> None:
    assert from_litellm(
        {"prompt_tokens": 1000, "completion_tokens": 50, "prompt_cache_hit_tokens": 768}
    ) == Usage(232, 768, 0, 50)
    assert from_litellm(
        {
            "prompt_tokens": 30,
            "completion_tokens": 2,
            "cache_read_input_tokens": 20,
            "cache_creation_input_tokens": 4,
        }
    ) == Usage(6, 20, 4, 2)


def test_counts_past_the_prompt_are_capped_so_classes_stay_disjoint() -> None:
    assert from_litellm(
        {
            "prompt_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 8},
        }
    ) == Usage(0, 8, 2, 0)


@pytest.mark.parametrize("normalise", [from_deepseek, from_gemini, from_openrouter, from_litellm])
def test_no_usage_is_missing(normalise) -> None:  # type: ignore[no-untyped-def]
    assert normalise(None).source is UsageSource.MISSING
    assert normalise({}).source is UsageSource.MISSING


def test_1h_writes_cannot_exceed_all_writes() -> None:
    with pytest.raises(ValueError, match="part of cache_write_tokens"):
        Usage(cache_write_tokens=1, cache_write_1h_tokens=2)
