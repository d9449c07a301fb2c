"""A replica's own account of its load and cache, read from its Prometheus ``/metrics``.

vLLM (and ``kvgate sim``) export, per engine and model::

    vllm:num_requests_running   vllm:num_requests_waiting   vllm:kv_cache_usage_perc
    vllm:prefix_cache_queries_total   vllm:prefix_cache_hits_total   (tokens)
    vllm:prompt_tokens_total   vllm:generation_tokens_total   (tokens; for reconciliation)
    vllm:cache_config_info{block_size="32", prefix_caching_hash_algo="sha256",
                           num_gpu_blocks="2048", ...} 1.0

The gateway counts only its own requests; the replica's numbers include every other
gateway's, so the fleet's snapshot takes the larger of the two. The cache config is how
exact mode learns the block size and hash algorithm instead of assuming them.

Only the lines wanted are parsed (vLLM's page is mostly histograms), so a poll costs
well under a millisecond of the event loop.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import aiohttp

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_WANTED = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:cache_config_info",
)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """How the replica names and sizes its KV blocks."""

    block_size: int
    hash_algo: str = "sha256"
    num_blocks: int | None = None
    prefix_caching: bool = True


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One reading of a replica's metrics (summed over its engines)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # share of KV blocks in use, 0..1 (mean over engines)
    prefix_cache_queries: int = 0  # tokens, since the replica started
    prefix_cache_hits: int = 0  # tokens, since the replica started
    prompt_tokens: int = 0  # since the replica started
    generation_tokens: int = 0  # since the replica started
    cache: CacheConfig | None = None
    read_at: float = 0.0  # time.monotonic() of the reading


def parse_metrics(text: str, *, model: str | None = None, read_at: float = 0.0) -> ReplicaLoad:
    """The load in a Prometheus exposition text; ``model`` filters by ``model_name``."""
    totals = dict.fromkeys(_WANTED, 0.0)
    usage: list[float] = []
    cache: CacheConfig | None = None
    for line in text.splitlines():
        if not line.startswith(_WANTED):
            continue
        match = _SAMPLE.match(line)
        if match is None or match["name"] not in totals:
            continue
        labels = dict(_LABEL.findall(match["labels"] or ""))
        if model is not None and labels.get("model_name", model) != model:
            continue
        name, value = match["name"], float(match["value"])
        if name == "vllm:cache_config_info":
            cache = cache or _cache_config(labels)
        elif name == "vllm:kv_cache_usage_perc":
            usage.append(value)
        else:
            totals[name] += value
    return ReplicaLoad(
        running=int(totals["vllm:num_requests_running"]),
        waiting=int(totals["vllm:num_requests_waiting"]),
        kv_usage=sum(usage) / len(usage) if usage else 0.0,
        prefix_cache_queries=int(totals["vllm:prefix_cache_queries_total"]),
        prefix_cache_hits=int(totals["vllm:prefix_cache_hits_total"]),
        prompt_tokens=int(totals["vllm:prompt_tokens_total"]),
        generation_tokens=int(totals["vllm:generation_tokens_total"]),
        cache=cache,
        read_at=read_at,
    )


async def read_load(
    session: aiohttp.ClientSession, url: str, *, model: str | None = None, timeout_s: float = 2.0
) -> ReplicaLoad | None:
    """GET the replica's /metrics; None when it does not answer with them."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.get(url + "/metrics", timeout=timeout) as reply:
            if reply.status != 200:
                return None
            text = await reply.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    return parse_metrics(text, model=model, read_at=time.monotonic())


def _cache_config(labels: dict[str, str]) -> CacheConfig | None:
    try:
        block_size = int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    blocks = labels.get("num_gpu_blocks", "")
    return CacheConfig(
        block_size=block_size,
        hash_algo=labels.get("prefix_caching_hash_algo", "sha256"),
        num_blocks=int(blocks) if blocks.isdigit() else None,
        prefix_caching=labels.get("enable_prefix_caching", "True") == "True",
    )
