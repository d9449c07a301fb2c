"""Helpers for tests that look at the replicas themselves: their counters, their tokens,
and their KV event streams."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence

from gateway.routing.load import parse_metrics
from gateway.routing.vllm_blocks import BlockHashing
from tests.support.vllm import BLOCK_SIZE, SERVED_NAME

_VOCABULARY = ("cache block token prefix model replica gateway router tenant salt hash chain queue "
          "batch decode prefill stream chunk usage price cost ledger record window context "
          "prompt answer signal vector matrix kernel memory latency budget invoice statement "
          "rate hit miss evict reuse warm cold fast steady exact simple quiet bright river "
          "stone cloud field orbit harbor lantern meadow summit thread anchor beacon")


def text(seed: int, words: int) -> str:
    """Deterministic prose over words both tokenizers know: about one token a word."""
    vocabulary = _VOCABULARY.split()
    step = seed % 5 + 1
    return " ".join(vocabulary[(seed * 7 + i * step) % len(vocabulary)] for i in range(words))


def prefix_cache_hits(urls: Sequence[str]) -> int:
    """Σ vllm:prefix_cache_hits_total over the replicas (tokens served from cache)."""
    total = 0
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
            total += parse_metrics(reply.read().decode(), model=SERVED_NAME).prefix_cache_hits
    return total


def replica_tokens(url: str, messages: list[dict[str, str]]) -> list[int]:
    """The prompt tokens the replica itself computes for a chat (its /tokenize)."""
    body = json.dumps({"model": SERVED_NAME, "messages": messages}).encode()
    request = urllib.request.Request(url + "/tokenize", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return list(json.loads(reply.read())["tokens"])


def block_keys(tokens: Sequence[int], salt: str | None = None) -> list[int]:
    """The blocks of ``tokens`` as the replica's KV events name them."""
    return BlockHashing().keys(tokens, BLOCK_SIZE, salt)
