"""/metrics splits tokens, cost, savings and unpriced requests by endpoint (as
``kvgate_requests`` does): a chat, an embeddings and a messages call of one model are three
series each, with exactly their own figures."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.accounting.records import Record
from gateway.metrics import Metrics
from gateway.serving.calls import Endpoint
from gateway.usage import Usage
from tests.factories import record


def samples(metrics: Metrics, name: str) -> dict[tuple[str, ...], float]:
    """One counter's samples of model m that counted something (a series' children exist
    from its first request, at 0), by their other labels' values (sorted by label)."""
    found = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == "m" and sample.value:
                labels = {k: v for k, v in sample.labels.items() if k != "model"}
                found[tuple(labels[k] for k in sorted(labels))] = sample.value
    return found


def test_tokens_cost_savings_and_unpriced_requests_are_counted_per_endpoint() -> None:
    metrics = Metrics()
    chat = record("req_1", usage=Usage(176, 1024, 0, 30), endpoint=Endpoint.CHAT.value)
    embeddings = record("req_2", usage=Usage(500, 0, 0, 0), endpoint=Endpoint.EMBEDDINGS.value)
    messages = record("req_3", usage=Usage(100, 200, 64, 20), endpoint=Endpoint.MESSAGES.value)
    unpriced = record(
        "req_4", usage=Usage(10, 0, 0, 5), endpoint=Endpoint.RESPONSES.value, prices=None
    )
    records: list[Record] = [chat, embeddings, messages, unpriced]
    for each in records:
        metrics.observe(each)

    assert samples(metrics, "kvgate_tokens_total") == {
        (Endpoint.CHAT.value, "uncached"): 176,
        (Endpoint.CHAT.value, "cache_read"): 1024,
        (Endpoint.CHAT.value, "output"): 30,
        (Endpoint.EMBEDDINGS.value, "uncached"): 500,
        (Endpoint.MESSAGES.value, "uncached"): 100,
        (Endpoint.MESSAGES.value, "cache_read"): 200,
        (Endpoint.MESSAGES.value, "cache_write"): 64,
        (Endpoint.MESSAGES.value, "output"): 20,
        (Endpoint.RESPONSES.value, "uncached"): 10,
        (Endpoint.RESPONSES.value, "output"): 5,
    }
    assert samples(metrics, "kvgate_cost_usd_total") == {
        (each.endpoint,): float(each.cost.total) for each in (chat, embeddings, messages)
    }
    assert all(cost > 0 for cost in samples(metrics, "kvgate_cost_usd_total").values())
    # Embeddings read no cache (saved 0); messages wrote some, which may cost above input.
    assert embeddings.cost.saved == 0 and chat.cost.saved > 0
    saved = {(each.endpoint,): float(each.cost.saved) for each in (chat, messages)}
    assert samples(metrics, "kvgate_cache_saved_usd_total") == {
        key: value for key, value in saved.items() if value > 0
    }
    assert samples(metrics, "kvgate_cache_write_premium_usd_total") == {
        key: -value for key, value in saved.items() if value < 0
    }
    assert samples(metrics, "kvgate_unpriced_requests_total") == {(Endpoint.RESPONSES.value,): 1}
