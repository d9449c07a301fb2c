"""Prometheus metrics, one registry per app (no globals: several apps can share a process)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from gateway.accounting.records import Record

# How a gauge's workers' values are combined (prometheus_client's multiprocess modes).
GaugeMode = Literal["liveall", "livemin", "livemax", "livesum", "mostrecent"]
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """The gateway's Prometheus metrics; ``multiprocess_dir`` when it runs as several workers."""

    def __init__(self, *, multiprocess_dir: Path | None = None) -> None:
        self.multiprocess = multiprocess_dir is not None
        # The labelled children each (model, upstream) counts into, looked up once: a
        # ``labels()`` call per counter per request was most of ``observe``'s time.
        self._series: dict[tuple[str, str, str], _Series] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def gauge(name: str, doc: str, mode: GaugeMode, labels: Sequence[str] = ()) -> Gauge:
            return Gauge(name, doc, labels, multiprocess_mode=mode, registry=r)

        self.requests = counter(
            "kvgate_requests",
            "Requests (attempts) by outcome and endpoint",
            ["model", "upstream", "endpoint", "status"],
        )
        self.tokens = counter(
            "kvgate_tokens", "Tokens by class and endpoint", ["model", "endpoint", "token_class"]
        )
        self.ceiling = counter(
            "kvgate_ceiling_cached_tokens",
            "Prompt tokens the ceiling says any router could have served from cache (requests"
            " whose router computed one: vLLM deployments)",
            ["model", "endpoint"],
        )
        self.ceiling_prompt = counter(
            "kvgate_ceiling_prompt_tokens",
            "Prompt tokens of the requests counted in kvgate_ceiling_cached_tokens",
            ["model", "endpoint"],
        )
        self.ceiling_read = counter(
            "kvgate_ceiling_cache_read_tokens",
            "Tokens read from cache by the requests counted in kvgate_ceiling_cached_tokens",
            ["model", "endpoint"],
        )
        self.cost = counter("kvgate_cost_usd", "Cost in USD", ["model", "endpoint"])
        self.saved = counter(
            "kvgate_cache_saved_usd", "Cost the prefix cache saved, in USD", ["model", "endpoint"]
        )
        self.cache_premium = counter(
            "kvgate_cache_write_premium_usd",
            "What cache writes cost above plain input, where they did, in USD",
            ["model", "endpoint"],
        )
        self.unpriced = counter(
            "kvgate_unpriced_requests",
            "Requests for a model with no price in force",
            ["model", "endpoint"],
        )
        self.client_disconnects = counter(
            "kvgate_client_disconnects",
            "Clients gone before their request was read: hung up, or cut at the body deadline"
            " (KVGATE_BODY_TIMEOUT_S), by phase",
            ["phase"],
        )
        self.client_disconnects.labels("body")  # shown from the start, at 0
        self.spend_refusals = counter(
            "kvgate_spend_refusals",
            "Requests refused at admission: budget (402) or rate_limit (429)",
            ["reason"],
        )
        self.budget_alerts = counter(
            "kvgate_budget_alerts",
            "Budget threshold alerts by how their webhook delivery ended",
            ["status"],
        )
        self.ttft = Histogram(
            "kvgate_ttft_seconds",
            "Time to first token",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "kvgate_request_duration_seconds",
            "Request duration",
            ["model", "upstream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.recorder_backlog = gauge(
            "kvgate_recorder_backlog",
            "Records journaled but not yet in the database",
            "livesum",
        )
        self.journal_bytes = gauge(
            "kvgate_journal_bytes",
            "Size of the local record journal",
            "livemax",
        )
        self.journal_sync_lag = gauge(
            "kvgate_journal_sync_lag_seconds",
            "Longest time a written record waited for its flush to disk, since the last scrape"
            " (what a machine crash could lose; journal_sync=background)",
            "livemax",
        )
        self.records_rejected = gauge(
            "kvgate_records_rejected",
            "Records the database refused for their data, set aside in <journal>/rejected/",
            "livesum",
        )
        self.spans_dropped = gauge(
            "kvgate_spans_dropped",
            "OpenTelemetry spans not exported: the writer's span queue was full, or the"
            " collector did not take them",
            "livesum",
        )
        self.database_up = gauge(
            "kvgate_database_up",
            "1 when the recorder last reached the database",
            "livemin",
        )
        self.replica_up = gauge(
            "kvgate_replica_up",
            "1 when a replica is taken for routing",
            "livemin",
            ["model", "replica"],
        )
        self.replica_kv_events_fresh = gauge(
            "kvgate_replica_kv_events_fresh",
            "1 while a replica's KV event stream is in sync (exact routing), 0 when stale",
            "livemin",
            ["model", "replica"],
        )
        self.replica_kv_events_applied = gauge(
            "kvgate_replica_kv_events_applied",
            "Sequence number after the last KV event batch applied from a replica",
            "livemax",
            ["model", "replica"],
        )
        self.peer_messages = gauge(
            "kvgate_peer_messages",
            "Routing changes sent to, received from and dropped for the gateway's other"
            " workers (kvgate serve --workers), since start; per worker (pid label)",
            "liveall",
            ["direction"],
        )
        self.replica_in_flight = gauge(
            "kvgate_replica_in_flight",
            "Requests in flight per replica",
            "livesum",
            ["model", "replica"],
        )
        # Reconciliation against the engine (gateway/serving/reconciler.py).
        self.replica_drift = gauge(
            "kvgate_replica_drift_ratio",
            "(recorded - counted) / counted tokens of a replica over the last window checked:"
            " kvgate's records against the replica's own counters (tokens: prompt, cached)",
            "mostrecent",
            ["replica", "tokens"],
        )
        self.replica_drift_windows = counter(
            "kvgate_replica_drift_windows",
            "Windows in which a replica's own counters and kvgate's records of it were more"
            " than 1 % apart (tokens: prompt, cached)",
            ["replica", "tokens"],
        )

    def observe(self, record: Record) -> None:
        """Count one finished attempt."""
        key = (record.model, record.upstream, record.endpoint)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(self, *key)
        usage = record.usage
        series.requests(record.status.value).inc()
        if usage.uncached_tokens:
            series.uncached.inc(usage.uncached_tokens)
        if usage.cache_read_tokens:
            series.cache_read.inc(usage.cache_read_tokens)
        if usage.cache_write_tokens:
            series.cache_write.inc(usage.cache_write_tokens)
        if usage.output_tokens:
            series.output.inc(usage.output_tokens)
        if record.priced:
            series.cost.inc(float(record.cost.total))
            # A request that writes the cache can cost more than no cache at all (writes are
            # priced above input); counters only grow, so that premium is counted apart.
            saved = float(record.cost.saved)
            if saved >= 0:
                series.saved.inc(saved)
            else:
                series.cache_premium.inc(-saved)
        else:
            series.unpriced.inc()
        ceiling = record.stored_ceiling
        if ceiling is not None:
            # Hit rate against the ceiling, over the same requests (Grafana's panel), with
            # the ceiling the record's row keeps (never below what was achieved): the panel
            # can no more show efficiency above 100 % than the dashboard can.
            series.ceiling.inc(ceiling)
            series.ceiling_prompt.inc(usage.prompt_tokens)
            series.ceiling_read.inc(usage.cache_read_tokens)
        if record.first_token_at is not None:
            series.ttft.observe((record.first_token_at - record.started_at).total_seconds())
        series.latency.observe((record.ended_at - record.started_at).total_seconds())

    def collect_gauges(self, update: Callable[[Metrics], None]) -> None:
        """Have ``update`` set the live gauges on these metrics."""
        update(self)

    def worker_stopped(self) -> None:
        """A worker leaving: its live gauges stop counting (its counters stay)."""
        if self.multiprocess:
            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    def exposition(self) -> bytes:
        """The text format. With several workers (PROMETHEUS_MULTIPROC_DIR set by
        ``kvgate serve --workers``), every worker's values, summed or taken at their
        min/max as each gauge says: a scrape reaches one worker but reports them all."""
        if self.multiprocess:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)


class _Series:
    """One (model, upstream, endpoint)'s children of the request metrics."""

    def __init__(self, metrics: Metrics, model: str, upstream: str, endpoint: str) -> None:
        self._requests = metrics.requests
        self._by_status: dict[str, Any] = {}
        self.model, self.upstream, self.endpoint = model, upstream, endpoint
        self.uncached = metrics.tokens.labels(model, endpoint, "uncached")
        self.cache_read = metrics.tokens.labels(model, endpoint, "cache_read")
        self.cache_write = metrics.tokens.labels(model, endpoint, "cache_write")
        self.output = metrics.tokens.labels(model, endpoint, "output")
        self.cost = metrics.cost.labels(model, endpoint)
        self.ceiling = metrics.ceiling.labels(model, endpoint)
        self.ceiling_prompt = metrics.ceiling_prompt.labels(model, endpoint)
        self.ceiling_read = metrics.ceiling_read.labels(model, endpoint)
        self.saved = metrics.saved.labels(model, endpoint)
        self.cache_premium = metrics.cache_premium.labels(model, endpoint)
        self.unpriced = metrics.unpriced.labels(model, endpoint)
        self.ttft = metrics.ttft.labels(model)
        self.latency = metrics.latency.labels(model, upstream)

    def requests(self, status: str) -> Any:
        child = self._by_status.get(status)
        if child is None:
            child = self._by_status[status] = self._requests.labels(
                self.model, self.upstream, self.endpoint, status
            )
        return child
