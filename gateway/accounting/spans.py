"""OpenTelemetry: every attempt one span, in the GenAI semantic conventions, over OTLP/HTTP.

Made by the records' writer, not on the request path: the drainer (``drainer.py``), in the
gateway's writer child process (or its thread, when the writer is a thread), hands each
batch of its own journal's records, once in the database, to ``Spans.offer``; a thread of
its own makes their spans, with the attempts' own start and end times, and exports them
in batches every ``export_interval_ms``. The request path only puts on the record what a
span needs beyond it (operation, provider, response model, the caller's traceparent:
``serving/records.py``). On only with ``KVGATE_OTLP_ENDPOINT``; the SDK is imported then,
in the writer, never otherwise.

Nothing here can block or fail recording: a full queue (``max_pending`` records) drops
the batch, an export the collector refuses or cannot take drops its spans, both counted
in ``dropped`` (``kvgate_spans_dropped``), and both only log.

Each span is exported once, by the writer of the gateway process that journaled it.
Records replayed from a dead process's journal (after a crash) make no span: those whose
spans had gone out are not sent twice, and those whose spans had not are lost with the
crash, as spans still in an SDK's queue would be. A record journaled before these fields
existed makes none either.

A request that failed over is several attempts, so several spans, siblings under the
caller's ``traceparent`` (W3C trace context) when it sent one; ``kvgate.attempt`` numbers
them. The attributes:

    gen_ai.operation.name            chat | text_completion | embeddings
    gen_ai.provider.name             vllm, or the litellm provider (anthropic, openai, ...)
    gen_ai.request.model             the model the client asked for
    gen_ai.response.model            the model that answered (as billed)
    gen_ai.usage.input_tokens        all input tokens, cached ones included
    gen_ai.usage.cache_read.input_tokens, gen_ai.usage.cache_creation.input_tokens
    gen_ai.usage.output_tokens
    gen_ai.conversation.id           the interaction id
    kvgate.cost_usd                  the attempt's cost (absent when the model has no price)
    kvgate.tenant, kvgate.replica, kvgate.predicted_cached_tokens (when predicted),
    kvgate.request_id, kvgate.attempt, and error.type on a failed or cancelled attempt
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gateway.accounting.records import Record, Status

log = logging.getLogger("kvgate.telemetry")

TRACES_PATH = "/v1/traces"
# Spans in one OTLP request at most (about 0.7 kB each encoded).
EXPORT_BATCH = 512


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: ``endpoint`` as given when it names the traces path, else
    the collector's base URL with it (as OTEL_EXPORTER_OTLP_ENDPOINT is read)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def attributes_of(record: Record) -> dict[str, Any]:
    """The span's attributes (see the module's docstring)."""
    usage = record.usage
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": record.operation,
        "gen_ai.provider.name": record.provider,
        "gen_ai.request.model": record.model,
        "gen_ai.response.model": record.response_model,
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.conversation.id": record.interaction_id,
        "kvgate.tenant": record.tenant_id,
        "kvgate.replica": record.upstream,
        "kvgate.request_id": record.request_id,
        "kvgate.attempt": record.attempt,
    }
    if record.priced:
        attributes["kvgate.cost_usd"] = float(record.cost.total)
    if record.predicted_cached_tokens is not None:
        attributes["kvgate.predicted_cached_tokens"] = record.predicted_cached_tokens
    if record.status is not Status.COMPLETED:
        attributes["error.type"] = record.status.value
    return attributes


def _nanoseconds(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000) * 1000


class Spans:
    """The spans of written records, made and exported on a thread of their own."""

    def __init__(
        self, endpoint: str, *, export_interval_ms: float = 1000.0, max_pending: int = 65_536
    ) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        finished: list[ReadableSpan] = []

        class Collect(SpanProcessor):
            """Ended spans into ``finished``, exported by ``Spans._export``."""

            def on_end(self, span: ReadableSpan) -> None:
                finished.append(span)

        self.url = traces_url(endpoint)
        self.interval_s = export_interval_ms / 1000
        self.max_pending = max_pending
        self._finished = finished
        self._exporter = OTLPSpanExporter(endpoint=self.url)
        self._provider = TracerProvider(resource=Resource.create({"service.name": "kvgate"}))
        self._provider.add_span_processor(Collect())
        self._tracer = self._provider.get_tracer("kvgate")
        self._propagator = TraceContextTextMapPropagator()
        self._queue: queue.SimpleQueue[Sequence[Record]] = queue.SimpleQueue()
        self._pending = 0  # records queued, not yet made into spans
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvgate-spans", daemon=True)
        self.exported = 0
        self.dropped = 0

    def start(self) -> None:
        """Start the exporting thread."""
        self._thread.start()
        log.info("OpenTelemetry: a span per attempt to %s", self.url)

    def offer(self, records: Sequence[Record]) -> None:
        """Queue the spans of a batch of written records; never waits (full: dropped)."""
        records = [r for r in records if r.operation is not None]
        if not records:
            return
        with self._lock:
            full = self._pending + len(records) > self.max_pending
            if not full:
                self._pending += len(records)
        if full:
            self._drop(len(records), "the queue is full")
            return
        self._queue.put(records)

    def close(self, timeout_s: float = 5.0) -> None:
        """Make the spans still queued, export them (bounded by ``timeout_s``), stop."""
        self._closing.set()
        self._queue.put(())
        self._thread.join(timeout=timeout_s)
        self._provider.shutdown()
        self._exporter.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it untyped

    def _run(self) -> None:
        due = time.monotonic() + self.interval_s
        while True:
            try:
                records = self._queue.get(timeout=max(due - time.monotonic(), 0.0))
            except queue.Empty:
                records = ()
            with self._lock:
                self._pending -= len(records)
            for record in records:
                try:
                    self._span(record)
                except Exception:
                    log.exception("OpenTelemetry: a span could not be made")
            closing = self._closing.is_set() and self._queue.empty()
            if time.monotonic() >= due or len(self._finished) >= EXPORT_BATCH or closing:
                self._export()
                due = time.monotonic() + self.interval_s
            if closing:
                return

    def _export(self) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        while self._finished:
            batch = self._finished[:EXPORT_BATCH]
            del self._finished[:EXPORT_BATCH]
            try:
                result = self._exporter.export(batch)
            except Exception as exc:
                self._drop(len(batch), f"the export failed: {exc}")
                continue
            if result is SpanExportResult.SUCCESS:
                self.exported += len(batch)
            else:
                self._drop(len(batch), f"{self.url} did not take them")

    def _drop(self, count: int, why: str) -> None:
        with self._lock:  # from the drainer's thread (a full queue) and from this one
            before, self.dropped = self.dropped, self.dropped + count
        if before // 10_000 != self.dropped // 10_000 or before == 0:
            log.warning("OpenTelemetry: %d spans dropped so far (%s)", self.dropped, why)

    def _span(self, record: Record) -> None:
        from opentelemetry.trace import SpanKind, StatusCode

        parent = (
            self._propagator.extract({"traceparent": record.traceparent})
            if record.traceparent
            else None
        )
        span = self._tracer.start_span(
            f"{record.operation} {record.model}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attributes_of(record),
            start_time=_nanoseconds(record.started_at),
        )
        if record.status is not Status.COMPLETED:
            span.set_status(StatusCode.ERROR, record.error)
        span.end(end_time=_nanoseconds(record.ended_at))
