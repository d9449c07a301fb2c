"""The simulated replica's /metrics: vLLM's metric names in Prometheus text format.

Written by hand from the engine's counters rather than through a prometheus_client
registry, whose globals would mix up several simulators running in one process.

Cached tokens by tier use vLLM 0.32's names (``vllm/v1/metrics/loggers.py``):
``vllm:prefix_cache_hits`` counts GPU memory's hits only (the local prefix cache),
``vllm:external_prefix_cache_queries`` / ``_hits`` the lower tiers' (its KV connector),
``vllm:prompt_tokens_cached_by_source{source=device|host|disk|p2p|external_unspecified}``
and ``vllm:prompt_tokens_by_source{source=local_compute|local_cache_hit|external_kv_transfer}``
all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.tiers import MEDIA, SOURCES
from gateway.tools.sim.engine import Engine

_GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
_COUNTERS = (
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "Number of generation tokens processed."),
)


def render_metrics(engine: Engine, model: str) -> str:
    """The exposition text of one replica serving ``model``."""
    labels = f'engine="0",model_name="{_escape(model)}"'
    stats = engine.stats
    gauges = (stats.running, stats.waiting, engine.cache.usage)
    counters = (
        stats.prefix_cache_queries,
        stats.prefix_cache_hits,
        stats.prompt_tokens,
        stats.generation_tokens,
    )
    lines: list[str] = []
    for (name, help_text), value in zip(_GAUGES, gauges, strict=True):
        lines += _family(name, help_text, "gauge", [(labels, value)])
    for (name, help_text), value in zip(_COUNTERS, counters, strict=True):
        lines += _family(f"{name}_total", help_text, "counter", [(labels, value)])
    by_tier = stats.cached_by_tier
    external = by_tier[1] + by_tier[2]
    lines += _family(
        "vllm:external_prefix_cache_queries_total",
        "External prefix cache queries from KV connector cross-instance cache sharing, "
        "in terms of number of queried tokens.",
        "counter",
        [(labels, stats.external_queries)],
    )
    lines += _family(
        "vllm:external_prefix_cache_hits_total",
        "External prefix cache hits from KV connector cross-instance cache sharing, "
        "in terms of number of cached tokens.",
        "counter",
        [(labels, external)],
    )
    sources = [SOURCES[medium] for medium in MEDIA]
    lines += _family(
        "vllm:prompt_tokens_cached_by_source_total",
        "Prefix-cache hit tokens by the cache tier that supplied them.",
        "counter",
        [
            (f'{labels},source="{source}"', tokens)
            for source, tokens in zip(sources, by_tier, strict=True)
        ]
        + [(f'{labels},source="{source}"', 0) for source in ("p2p", "external_unspecified")],
    )
    computed = stats.prompt_tokens - sum(by_tier)
    lines += _family(
        "vllm:prompt_tokens_by_source_total",
        "Number of prompt tokens by source.",
        "counter",
        [
            (f'{labels},source="local_compute"', computed),
            (f'{labels},source="local_cache_hit"', by_tier[0]),
            (f'{labels},source="external_kv_transfer"', external),
        ],
    )
    finished = [
        (f'{labels},finished_reason="{reason}"', count) for reason, count in stats.finished.items()
    ]
    lines += _family(
        "vllm:request_success_total",
        "Count of successfully processed requests.",
        "counter",
        finished,
    )
    info = (
        f'block_size="{engine.block_size}",enable_prefix_caching="True",engine="0",'
        f'model_name="{_escape(model)}",num_gpu_blocks="{engine.cache.capacity_blocks}",'
        'prefix_caching_hash_algo="sha256"'
    )
    lines += _family(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge", [(info, 1)]
    )
    return "\n".join(lines) + "\n"


def _family(
    name: str, help_text: str, kind: str, samples: Sequence[tuple[str, float]]
) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines.extend(f"{name}{{{labels}}} {float(value)!r}" for labels, value in samples)
    return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
