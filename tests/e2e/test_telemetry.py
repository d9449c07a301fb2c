"""OpenTelemetry end to end: `kvgate serve` with KVGATE_OTLP_ENDPOINT exports real OTLP
protobuf to a receiver on loopback; every attribute of every span is checked against the
request's record."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from gateway.db.models import RequestRow
from pricing.book import load_catalog
from tests.factories import litellm, vllm
from tests.providers.prices import SONNET
from tests.support.otlp import Receiver, attributes
from tests.support.stack import running_stack

pytestmark = pytest.mark.e2e
MODEL = "kvgate/demo-llama-8b"
KEY_ENV = "KVGATE_TEST_ANTHROPIC_KEY"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
SYSTEM = "You are the kvgate telemetry test assistant; answer in one short line. " * 8


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()


def test_every_attempt_is_one_span_with_the_genai_attributes(
    tmp_path: Path, receiver: Receiver
) -> None:
    with running_stack(
        tmp_path,
        f"sqlite:///{tmp_path / 'kvgate.db'}",
        prices=[*load_catalog(), SONNET],
        tenants=("alpha",),
        KVGATE_OTLP_ENDPOINT=receiver.url,
        KVGATE_OTLP_EXPORT_INTERVAL_MS="100",
        **{KEY_ENV: "sk-ant-test"},
    ) as stack:
        emulator = stack.start_emulator()
        stack.configure(
            [
                vllm(MODEL, [s.url for s in stack.start_sims(1)]),
                litellm(
                    "claude",
                    "anthropic/anthropic-cache-write",
                    api_base=emulator.url,
                    api_key_env=KEY_ENV,
                    price_model=SONNET.model,
                ),
            ]
        )
        stack.start_gateway()
        client = stack.client()
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
        traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
        replies = [
            client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=4,
                extra_headers={"traceparent": traceparent, "x-interaction-id": "conv-1"},
            )
            for _ in range(2)
        ]
        text = client.completions.with_raw_response.create(
            model=MODEL, prompt="Once upon a time", max_tokens=3
        )
        hosted = client.chat.completions.with_raw_response.create(
            model="claude",
            messages=messages,  # type: ignore[arg-type]
        )
        # The other wires on the vLLM path: Responses and Messages are chats, embeddings
        # their own operation.
        responses = client.responses.with_raw_response.create(
            model=MODEL, instructions=SYSTEM, input="hi", max_output_tokens=4
        )
        embeddings = client.embeddings.with_raw_response.create(model=MODEL, input="embed me")
        claude = anthropic.Anthropic(base_url=stack.url, api_key=stack.key, max_retries=0)
        anthropic_messages = claude.messages.with_raw_response.create(
            model=MODEL, max_tokens=4, system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
        )
        wires = {
            responses.headers["x-request-id"]: "chat",
            embeddings.headers["x-request-id"]: "embeddings",
            anthropic_messages.headers["x-request-id"]: "chat",
        }
        ids = [r.headers["x-request-id"] for r in (*replies, text, hosted)]
        rows = {r.request_id: r for r in stack.rows(count=7)}
        spans = receiver.wait(7)

    assert receiver.content_types == {"application/x-protobuf"}
    by_request = {attributes(s.attributes)["kvgate.request_id"]: (res, s) for res, s in spans}
    assert sorted(by_request) == sorted([*ids, *wires])
    first, second, text_id, hosted_id = ids
    assert {rows[i].endpoint for i in wires} == {
        "/v1/responses", "/v1/embeddings", "/v1/messages"
    }  # fmt: skip
    assert rows[second].cache_read_tokens > 0  # the repeat is served from cache
    assert rows[hosted_id].cache_write_tokens > 0  # the emulated Anthropic writes the cache
    for request_id, (resource, span) in by_request.items():
        row: RequestRow = rows[request_id]
        assert resource["service.name"] == "kvgate"
        operation = wires.get(request_id, "text_completion" if request_id == text_id else "chat")
        assert span.name == f"{operation} {row.model}"
        assert span.kind == Span.SpanKind.SPAN_KIND_CLIENT
        assert span.status.code == Status.StatusCode.STATUS_CODE_UNSET
        assert span.start_time_unix_nano == int(row.started_at.timestamp() * 1e6) * 1000
        assert span.end_time_unix_nano == int(row.ended_at.timestamp() * 1e6) * 1000
        expected = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "anthropic" if request_id == hosted_id else "vllm",
            "gen_ai.request.model": row.model,
            "gen_ai.response.model": SONNET.model if request_id == hosted_id else MODEL,
            # All input, cached included (the 1-hour writes are part of cache_write_tokens).
            "gen_ai.usage.input_tokens": (
                row.uncached_tokens + row.cache_read_tokens + row.cache_write_tokens
            ),
            "gen_ai.usage.cache_read.input_tokens": row.cache_read_tokens,
            "gen_ai.usage.cache_creation.input_tokens": row.cache_write_tokens,
            "gen_ai.usage.output_tokens": row.output_tokens,
            "gen_ai.conversation.id": row.interaction_id,
            "kvgate.cost_usd": float(row.cost_total),
            "kvgate.tenant": row.tenant_id,
            "kvgate.replica": row.upstream,
            "kvgate.request_id": request_id,
            "kvgate.attempt": 1,
        }
        if row.predicted_cached_tokens is not None:
            expected["kvgate.predicted_cached_tokens"] = row.predicted_cached_tokens
        assert attributes(span.attributes) == expected
    # The vLLM path predicts; the caller's trace context is honoured, and only where sent.
    assert "kvgate.predicted_cached_tokens" in attributes(by_request[second][1].attributes)
    for request_id in (first, second):
        span = by_request[request_id][1]
        assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
        assert attributes(span.attributes)["gen_ai.conversation.id"] == "conv-1"
    for request_id in (text_id, hosted_id, *wires):
        span = by_request[request_id][1]
        assert span.trace_id.hex() != TRACE_ID and span.parent_span_id == b""


def test_a_collector_that_is_down_fails_no_request(tmp_path: Path) -> None:
    with running_stack(
        tmp_path,
        f"sqlite:///{tmp_path / 'kvgate.db'}",
        tenants=("alpha",),
        KVGATE_OTLP_ENDPOINT="http://127.0.0.1:9/v1/traces",  # discard: nothing listens
        KVGATE_OTLP_EXPORT_INTERVAL_MS="50",
    ) as stack:
        stack.configure([vllm(MODEL, [s.url for s in stack.start_sims(1)])])
        stack.start_gateway()
        client = stack.client()
        for n in range(20):
            reply = client.completions.create(model=MODEL, prompt=f"n={n}", max_tokens=2)
            assert reply.usage is not None and reply.usage.completion_tokens == 2
        assert len(stack.rows(count=20)) == 20
