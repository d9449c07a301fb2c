"""The hit-rate-vs-ceiling series of /metrics count the ceiling a record's row keeps: the
router's, raised to what the replica reported, so Grafana's panel cannot show routing
efficiency above 100 % where the dashboard (reading the rows) cannot either."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import Metrics
from gateway.usage import Usage
from tests.factories import record


def ceiling_series(metrics: Metrics) -> dict[str, float]:
    """The three ceiling counters of model m, by name."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name.startswith("kvgate_ceiling_")
        and sample.name.endswith("_total")
        and sample.labels.get("model") == "m"
    }


def test_a_ceiling_below_the_reported_hit_is_counted_as_the_hit() -> None:
    metrics = Metrics()
    # Text mode: the router's character blocks saw 512 tokens' worth; the replica read 896.
    metrics.observe(record("req_1", usage=Usage(128, 896, 0, 10), ceiling_cached_tokens=512))
    metrics.observe(record("req_2", usage=Usage(24, 1000, 0, 10), ceiling_cached_tokens=1024))
    metrics.observe(record("req_3", usage=Usage(50, 0, 0, 10)))  # no ceiling: not counted
    assert ceiling_series(metrics) == {
        "kvgate_ceiling_cached_tokens_total": 896 + 1024,
        "kvgate_ceiling_prompt_tokens_total": 1024 + 1024,
        "kvgate_ceiling_cache_read_tokens_total": 896 + 1000,
    }
