"""A replica's load and cache config from its /metrics (lines as vLLM 0.32 writes them)."""

from __future__ import annotations

from gateway.routing.load import CacheConfig, ReplicaLoad, parse_metrics

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.75
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 216.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 96.0
vllm:prefix_cache_hits_created{engine="0",model_name="tiny"} 1.7959490655719666e+09
vllm:num_requests_running{engine="0",model_name="other"} 9.0
vllm:cache_config_info{_block_size_resolved="True",block_size="32",cache_dtype="auto",\
enable_prefix_caching="True",engine="0",hash_block_size="None",num_gpu_blocks="2048",\
prefix_caching_hash_algo="sha256_cbor",sliding_window="None"} 1.0
"""


def test_load_is_summed_over_engines_of_the_model() -> None:
    assert parse_metrics(VLLM_METRICS, model="tiny", read_at=5.0) == ReplicaLoad(
        running=4,
        waiting=2,
        kv_usage=0.5,
        prefix_cache_queries=216,
        prefix_cache_hits=96,
        cache=CacheConfig(block_size=32, hash_algo="sha256_cbor", num_blocks=2048),
        read_at=5.0,
    )


def test_without_a_model_every_model_counts_and_no_config_means_none() -> None:
    assert parse_metrics(VLLM_METRICS).running == 13
    assert parse_metrics("vllm:num_requests_waiting{} 4\n").cache is None
    assert parse_metrics("") == ReplicaLoad()
