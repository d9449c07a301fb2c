"""OpenTelemetry: every attempt one span, in the GenAI semantic conventions, over OTLP/HTTP.

On only with ``KVGATE_OTLP_ENDPOINT`` (the SDK is imported then, never otherwise). The
request path hands each kept record, with the few facts of its call, to a bounded queue
and goes on; a thread of its own makes the span, with the attempt's own start and end
times, and the SDK's BatchSpanProcessor exports spans in batches from its thread. Nothing
here can block or fail a request: a full queue drops the span (counted in ``dropped``),
and an exporter that cannot reach its collector only logs.

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
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.accounting.records import Record, Status
from gateway.serving.calls import Endpoint
from gateway.serving.context import Context

log = logging.getLogger("kvgate.telemetry")

# The GenAI conventions' operation names: the Responses and Messages APIs are chats.
OPERATIONS = {
    Endpoint.CHAT: "chat",
    Endpoint.COMPLETIONS: "text_completion",
    Endpoint.EMBEDDINGS: "embeddings",
    Endpoint.RESPONSES: "chat",
    Endpoint.MESSAGES: "chat",
    Endpoint.COUNT_TOKENS: "chat",
}
TRACES_PATH = "/v1/traces"


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: ``endpoint`` as given when it names the traces path, else
    the collector's base URL with it (as OTEL_EXPORTER_OTLP_ENDPOINT is read)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def provider_of(ctx: Context, upstream: str) -> str:
    """``vllm`` for a replica; a litellm model's provider prefix (no prefix: openai)."""
    if ctx.deployment.backend == "vllm":
        return "vllm"
    provider, slash, _ = upstream.partition("/")
    return provider if slash else "openai"


@dataclass(frozen=True, slots=True)
class Finished:
    """What a span is made of: the kept record and the facts of its call."""

    record: Record
    operation: str
    provider: str
    response_model: str
    traceparent: str | None


def attributes_of(finished: Finished) -> dict[str, Any]:
    """The span's attributes (see the module's docstring)."""
    record = finished.record
    usage = record.usage
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": finished.operation,
        "gen_ai.provider.name": finished.provider,
        "gen_ai.request.model": record.model,
        "gen_ai.response.model": finished.response_model,
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


class Telemetry:
    """Spans for kept records, made and exported off the event loop."""

    def __init__(
        self, endpoint: str, *, export_interval_ms: float = 1000.0, queue_size: int = 65_536
    ) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.url = traces_url(endpoint)
        self._provider = TracerProvider(resource=Resource.create({"service.name": "kvgate"}))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=self.url), schedule_delay_millis=export_interval_ms
            )
        )
        self._tracer = self._provider.get_tracer("kvgate")
        self._propagator = TraceContextTextMapPropagator()
        self._queue: queue.Queue[Finished | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="kvgate-telemetry", daemon=True)
        self.dropped = 0

    def start(self) -> None:
        """Start the exporting thread."""
        self._thread.start()
        log.info("OpenTelemetry: a span per attempt to %s", self.url)

    def observe(self, ctx: Context, record: Record, response_model: str) -> None:
        """Queue the span of one kept record; never waits."""
        finished = Finished(
            record=record,
            operation=OPERATIONS[ctx.call.endpoint],
            provider=provider_of(ctx, record.upstream),
            response_model=response_model,
            traceparent=ctx.traceparent,
        )
        try:
            self._queue.put_nowait(finished)
        except queue.Full:
            self.dropped += 1
            if self.dropped % 10_000 == 1:
                log.warning("OpenTelemetry: %d spans dropped (the queue is full)", self.dropped)

    def close(self) -> None:
        """Make the spans still queued, export what is pending, stop."""
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._provider.shutdown()

    def _run(self) -> None:
        while (finished := self._queue.get()) is not None:
            try:
                self._span(finished)
            except Exception:
                log.exception("OpenTelemetry: a span could not be made")

    def _span(self, finished: Finished) -> None:
        from opentelemetry.trace import SpanKind, StatusCode

        record = finished.record
        parent = (
            self._propagator.extract({"traceparent": finished.traceparent})
            if finished.traceparent
            else None
        )
        span = self._tracer.start_span(
            f"{finished.operation} {record.model}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attributes_of(finished),
            start_time=_nanoseconds(record.started_at),
        )
        if record.status is not Status.COMPLETED:
            span.set_status(StatusCode.ERROR, record.error)
        span.end(end_time=_nanoseconds(record.ended_at))
