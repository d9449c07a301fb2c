"""Usage normalisation: four disjoint classes from each wire convention."""

import pytest

from gateway.usage import (
    Usage,
    UsageSource,
    from_anthropic,
    from_openai,
    from_responses,
    from_vllm_anthropic,
    to_openai,
)


def test_openai_cached_tokens_are_inside_prompt_tokens() -> None:
    usage = from_openai(
        {
            "prompt_tokens": 1200,
            "completion_tokens": 30,
            "prompt_tokens_details": {"cached_tokens": 1024},
        }
    )
    assert usage == Usage(uncached_tokens=176, cache_read_tokens=1024, output_tokens=30)
    assert usage.prompt_tokens == 1200


def test_vllm_created_cache_tokens_stay_uncached() -> None:
    usage = from_openai(
        {
            "prompt_tokens": 64,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 32, "created_cache_tokens": 32},
        }
    )
    assert (usage.uncached_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (32, 32, 0)


def test_openai_without_details_has_no_cache_read() -> None:
    assert from_openai({"prompt_tokens": 10, "completion_tokens": 2}) == Usage(10, 0, 0, 2)
    assert from_openai(
        {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": None}
    ) == Usage(10, 0, 0, 2)


def test_cached_tokens_are_capped_at_the_prompt() -> None:
    usage = from_openai({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}})
    assert (usage.uncached_tokens, usage.cache_read_tokens) == (0, 10)


def test_anthropic_cache_tokens_are_on_top_of_input_tokens() -> None:
    usage = from_anthropic(
        {
            "input_tokens": 50,
            "cache_read_input_tokens": 2000,
            "cache_creation_input_tokens": 300,
            "output_tokens": 80,
        }
    )
    assert usage == Usage(
        uncached_tokens=50, cache_read_tokens=2000, cache_write_tokens=300, output_tokens=80
    )
    assert usage.prompt_tokens == 2350


def test_missing_usage_is_marked_missing_not_zero_reported() -> None:
    assert from_openai(None).source is UsageSource.MISSING
    assert from_anthropic({}).source is UsageSource.MISSING


def test_malformed_counts_count_as_zero() -> None:
    usage = from_openai(
        {
            "prompt_tokens": "12",
            "completion_tokens": True,
            "prompt_tokens_details": {"cached_tokens": -5},
        }
    )
    assert usage == Usage(0, 0, 0, 0)


def test_usage_refuses_negative_or_non_int_counts() -> None:
    with pytest.raises(ValueError):
        Usage(uncached_tokens=-1)
    with pytest.raises(ValueError):
        Usage(output_tokens=1.5)  # type: ignore[arg-type]


def test_to_openai_round_trips() -> None:
    usage = Usage(uncached_tokens=176, cache_read_tokens=1024, output_tokens=30)
    assert to_openai(usage) == {
        "prompt_tokens": 1200,
        "completion_tokens": 30,
        "total_tokens": 1230,
        "prompt_tokens_details": {"cached_tokens": 1024},
    }
    assert from_openai(to_openai(usage)) == usage


def test_responses_usage_counts_cached_tokens_inside_input_tokens() -> None:
    usage = from_responses(
        {
            "input_tokens": 120,
            "input_tokens_details": {"cached_tokens": 96, "cache_write_tokens": 24},
            "output_tokens": 7,
            "output_tokens_details": {"reasoning_tokens": 3},
        }
    )
    # vLLM's cache writes are prefill it computed: uncached. Reasoning is inside output.
    assert (usage.uncached_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (24, 96, 0)
    assert (usage.output_tokens, usage.prompt_tokens) == (7, 120)
    assert from_responses(None).source.value == "missing"
    assert (
        from_responses(
            {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 9}}
        ).cache_read_tokens
        == 5
    )


def test_vllm_anthropic_usage_bills_created_cache_tokens_as_uncached() -> None:
    usage = from_vllm_anthropic(
        {
            "input_tokens": 10,
            "cache_read_input_tokens": 96,
            "cache_creation_input_tokens": 14,
            "output_tokens": 4,
        }
    )
    assert (usage.uncached_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (24, 96, 0)
    assert (usage.output_tokens, usage.prompt_tokens) == (4, 120)
