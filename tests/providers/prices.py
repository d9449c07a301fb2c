"""The price entries the provider tests bill with (real list prices at their dates)."""

from pricing.book import Price, price_from_mapping

SONNET = price_from_mapping(
    {
        "model": "claude-sonnet-4-5",
        "effective_from": "2025-09-29",
        "input": "3",
        "cache_read": "0.30",
        "cache_write": "3.75",
        "cache_write_1h": "6",
        "output": "15",
        "long_context": {
            "above": 200_000,
            "input": "6",
            "cache_read": "0.60",
            "cache_write": "7.50",
            "cache_write_1h": "12",
            "output": "22.50",
        },
    }
)
# Anthropic prices Priority Tier by commitment, not by list; an operator enters the
# per-token rates of their contract as a tier of the entry (here 1.3x list).
SONNET_PRIORITY_CONTRACT = price_from_mapping(
    {
        "model": "claude-sonnet-4-5-contract",
        "effective_from": "2025-09-29",
        "input": "3",
        "cache_read": "0.30",
        "cache_write": "3.75",
        "output": "15",
        "tiers": {
            "priority": {
                "input": "3.90",
                "cache_read": "0.39",
                "cache_write": "4.875",
                "output": "19.50",
            }
        },
    }
)
GPT = price_from_mapping(
    {
        "model": "gpt-4.1",
        "effective_from": "2025-04-14",
        "input": "2",
        "cache_read": "0.50",
        "output": "8",
        "tiers": {
            "priority": {"input": "3.50", "cache_read": "0.875", "output": "14"},
            "flex": {"input": "1", "cache_read": "0.25", "output": "4"},
        },
    }
)
DEEPSEEK = price_from_mapping(
    {
        "model": "deepseek-chat",
        "effective_from": "2025-02-09",
        "input": "0.27",
        "cache_read": "0.07",
        "output": "1.10",
    }
)
GEMINI = price_from_mapping(
    {
        "model": "gemini-2.5-pro",
        "effective_from": "2025-06-17",
        "input": "1.25",
        "cache_read": "0.125",
        "output": "10",
        "long_context": {"above": 200_000, "input": "2.50", "cache_read": "0.25", "output": "15"},
    }
)
OPENROUTER_SONNET = price_from_mapping(
    {
        "model": "openrouter/anthropic/claude-sonnet-4.5",
        "effective_from": "2025-09-29",
        "input": "3",
        "cache_read": "0.30",
        "cache_write": "3.75",
        "output": "15",
    }
)
# Embeddings bill their input tokens only (they generate nothing, and OpenAI reports no
# cached tokens on them).
EMBEDDING_SMALL = price_from_mapping(
    {
        "model": "text-embedding-3-small",
        "effective_from": "2024-01-25",
        "input": "0.02",
        "cache_read": "0.02",
        "output": "0",
    }
)
ALL: list[Price] = [SONNET, GPT, DEEPSEEK, GEMINI, OPENROUTER_SONNET]
