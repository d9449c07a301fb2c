"""OpenTelemetry from the writer: a span per written record of the gateway's own journal,
in the writer's thread mode too; replayed and pre-upgrade records make none; a full queue
drops and counts."""

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gateway.accounting.recorder import Recorder, wait_until
from gateway.accounting.records import Record
from gateway.accounting.spans import Spans
from gateway.db.session import make_engine
from gateway.usage import Usage
from tests.factories import record as make_record
from tests.support.otlp import Receiver, attributes

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STARTED = datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=UTC)


def traced(request_id: str, **fields: object) -> Record:
    """A record as the request path now makes it: with the facts of its span."""
    values: dict[str, object] = {
        "operation": "chat",
        "provider": "vllm",
        "response_model": "m",
        "started_at": STARTED,
        "usage": Usage(176, 1024, 8, 30),
        **fields,
    }
    return make_record(request_id, **values)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()


async def test_a_writer_thread_exports_a_span_per_own_record_and_none_for_replayed_ones(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    """Thread mode (no writer process): the gateway's own records each become one span
    with the record's times and values; a crashed gateway's replayed records, and a record
    journaled before the span's fields existed, make none."""
    orphan = tmp_path / "999999-000001.jsonl"
    orphan.write_bytes(traced("req_replayed").to_json() + b"\n")
    engine = make_engine(database_url)
    recorder = Recorder(
        engine=engine,
        journal_dir=tmp_path,
        flush_interval_s=0.02,
        otlp_endpoint=receiver.url,
        otlp_export_interval_ms=50,
    )
    recorder.start()
    await recorder.record(traced("req_1", traceparent=TRACEPARENT))
    await recorder.record(traced("req_2", attempt=2))
    await recorder.record(make_record("req_old"))  # as journaled before: no span fields
    ((_, first), (_, second)) = sorted(
        receiver.wait(2), key=lambda s: attributes(s[1].attributes)["kvgate.request_id"]
    )
    assert await asyncio.to_thread(wait_until, lambda: recorder.stats.spans_exported == 2, 5)
    await recorder.stop()
    engine.dispose()
    assert recorder.stats.replayed == 1 and recorder.stats.written == 4
    assert recorder.stats.spans_dropped == 0 and len(receiver.spans) == 2
    assert first.name == "chat m" and first.kind == Span.SpanKind.SPAN_KIND_CLIENT
    assert first.start_time_unix_nano == int(STARTED.timestamp() * 1e6) * 1000
    assert first.end_time_unix_nano == first.start_time_unix_nano + 1_000_000_000
    assert first.trace_id.hex() == TRACEPARENT[3:35]
    assert first.parent_span_id.hex() == TRACEPARENT[36:52]
    assert second.parent_span_id == b""
    expected = traced("req_1")
    assert attributes(first.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "m",
        "gen_ai.response.model": "m",
        "gen_ai.usage.input_tokens": 176 + 1024 + 8,
        "gen_ai.usage.cache_read.input_tokens": 1024,
        "gen_ai.usage.cache_creation.input_tokens": 8,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.conversation.id": "req_1",
        "kvgate.cost_usd": float(expected.cost.total),
        "kvgate.tenant": "ten_a",
        "kvgate.replica": "http://r1",
        "kvgate.request_id": "req_1",
        "kvgate.attempt": 1,
    }
    assert attributes(second.attributes)["kvgate.attempt"] == 2


def test_a_full_span_queue_drops_and_counts_and_never_waits() -> None:
    spans = Spans("http://127.0.0.1:9", max_pending=3)  # never started: nothing is taken
    batch = [traced(f"req_{n}") for n in range(2)]
    spans.offer(batch)
    spans.offer(batch)  # 4 > 3: this batch is dropped
    spans.offer([make_record("req_old")])  # no span fields: neither queued nor dropped
    assert spans.dropped == 2
