"""The Responses API, Anthropic's Messages API and embeddings end to end: the official
``openai`` and ``anthropic`` clients → kvgate serve → kvgate sim replicas.

Each shows the cached tokens of a repeated prompt, a cost equal to an independent
computation from the catalog's rates (the demo model's entry in force since 2026-07-01:
input 0.15, cache read 0.015, output 0.45 USD per million tokens), the same figures on the
request's row and in the tenant's statement, on a line of its own endpoint: each client's
test has a tenant of its own, whose statement holds exactly what that client saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from sqlalchemy import select

from gateway.db.models import RequestRow
from tests.conftest import _backends, new_database
from tests.factories import demo_cost, vllm
from tests.support.processes import call, wait_recorded
from tests.support.stack import Stack, running_stack
from tests.support.statements import Seen

pytestmark = pytest.mark.e2e

MODEL = "kvgate/demo-llama-8b"
SOLO = "solo-llama"  # one replica: repeats land on the same cache
PAIR = "pair-llama"  # two replicas of its own: follow-ups of stored responses
SAME = {"price_model": MODEL, "upstream_model": MODEL}
SYSTEM = "You are the kvgate test assistant. Answer briefly and precisely. " * 12
BLOCK = 16


def hit(prompt: int) -> int:
    """What a repeated prompt reads from cache: every full block but the last token's."""
    return (prompt - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module", params=_backends())
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("wires")
    with (
        new_database(request.param, tmp) as database_url,
        running_stack(tmp, database_url, tenants=("alpha", "beta")) as stack,
    ):
        sims = stack.start_sims(3)
        stack.configure(
            [
                vllm(SOLO, [sims[0].url], **SAME),
                vllm(PAIR, [sims[1].url, sims[2].url], **SAME),
            ]
        )
        stack.start_gateway()
        yield stack


def oai(stack: Stack, tenant: str = "alpha") -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key=stack.keys[tenant], max_retries=0)


def claude(stack: Stack, tenant: str = "alpha") -> anthropic.Anthropic:
    """The Anthropic SDK against the gateway: its key in ``x-api-key``."""
    return anthropic.Anthropic(base_url=stack.url, api_key=stack.keys[tenant], max_retries=0)


def row_of(stack: Stack, request_id: str) -> RequestRow:
    wait_recorded(stack.url)
    with stack.engine.connect() as connection:
        (row,) = connection.execute(select(RequestRow).where(RequestRow.request_id == request_id))
    return row  # type: ignore[return-value]


def extra(value: Any, name: str) -> Any:
    """A member the gateway adds to the SDK's usage model (kept as an extra)."""
    return (value.model_extra or {})[name]


def fresh(stack: Stack, name: str) -> str:
    """A tenant of the test's own (its own cache salt: a first prompt is never cached)."""
    stack.tenant(name)
    return name


def saw_response(seen: Seen, usage: Mapping[str, Any]) -> None:
    """A Responses answer's usage (OpenAI's convention: cached tokens inside input)."""
    details = usage["input_tokens_details"]
    cached = details["cached_tokens"]
    seen.add(
        "/v1/responses",
        uncached=usage["input_tokens"] - cached,
        cached=cached,
        cache_write=details.get("cache_write_tokens") or 0,
        output=usage["output_tokens"],
        cost=usage["cost"],
    )


def saw_message(seen: Seen, usage: Mapping[str, Any]) -> None:
    """A Messages answer's usage (Anthropic's convention: cache reads on top of input)."""
    seen.add(
        "/v1/messages",
        uncached=usage["input_tokens"],
        cached=usage.get("cache_read_input_tokens") or 0,
        cache_write=usage.get("cache_creation_input_tokens") or 0,
        output=usage["output_tokens"],
        cost=usage["cost"],
    )


def check_statement(stack: Stack, tenant: str, seen: Seen) -> None:
    """The tenant's statement, once everything is recorded, says exactly what was seen."""
    wait_recorded(stack.url)
    seen.check(stack.statement(tenant))


def check_row(row: RequestRow, endpoint: str, uncached: int, cached: int, output: int) -> None:
    assert (row.endpoint, row.uncached_tokens, row.cache_read_tokens, row.output_tokens) == (
        endpoint,
        uncached,
        cached,
        output,
    )
    assert row.cost_total == demo_cost(uncached + cached, cached, output)


# -- /v1/responses ---------------------------------------------------------------------


def test_responses_create_repeated_prompt_is_cached_and_priced(stack: Stack) -> None:
    client = oai(stack)
    asked = {
        "model": SOLO,
        "instructions": SYSTEM,
        "input": "responses, sync",
        "max_output_tokens": 5,
    }
    first = client.responses.create(**asked)  # type: ignore[call-overload]
    second = client.responses.create(**asked)  # type: ignore[call-overload]
    assert first.output_text and first.output_text == second.output_text
    assert first.usage is not None and second.usage is not None
    prompt = first.usage.input_tokens
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert second.usage.input_tokens_details.cached_tokens == hit(prompt)
    for reply, cached in ((first, 0), (second, hit(prompt))):
        usage = reply.usage
        assert usage is not None
        assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
            prompt,
            5,
            prompt + 5,
        )
        assert Decimal(extra(usage, "cost")) == demo_cost(prompt, cached, 5)
        check_row(row_of(stack, reply._request_id), "/v1/responses", prompt - cached, cached, 5)  # type: ignore[attr-defined]


def test_responses_create_async_is_cached_priced_and_on_the_statement(stack: Stack) -> None:
    tenant = fresh(stack, "async-responses")

    async def twice() -> list[Any]:
        client = AsyncOpenAI(base_url=stack.base_url, api_key=stack.keys[tenant], max_retries=0)
        items = [{"role": "user", "content": [{"type": "input_text", "text": "responses, async"}]}]
        return [
            await client.responses.with_raw_response.create(
                model=SOLO,
                instructions=SYSTEM,
                input=items,
                max_output_tokens=4,  # type: ignore[arg-type]
            )
            for _ in range(2)
        ]

    raws = asyncio.run(twice())
    first, second = (raw.parse() for raw in raws)
    prompt = first.usage.input_tokens
    seen = Seen()
    for raw, reply, cached in ((raws[0], first, 0), (raws[1], second, hit(prompt))):
        usage = reply.usage
        assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (prompt, cached)
        assert Decimal(extra(usage, "cost")) == demo_cost(prompt, cached, 4)
        assert raw.headers["x-kvgate-cost"] == extra(usage, "cost")
        check_row(
            row_of(stack, raw.headers["x-request-id"]), "/v1/responses", prompt - cached, cached, 4
        )
        saw_response(seen, usage.model_dump())
    check_statement(stack, tenant, seen)


def test_responses_stream_relays_the_event_sequence_and_bills_response_completed(
    stack: Stack,
) -> None:
    tenant = fresh(stack, "streamed-responses")
    client = oai(stack, tenant)
    asked = {
        "model": SOLO,
        "instructions": SYSTEM,
        "input": "responses, streamed",
        "max_output_tokens": 6,
    }
    warm = client.responses.create(**asked)  # type: ignore[call-overload]  # warms the cache
    stream = client.responses.create(stream=True, **asked)  # type: ignore[call-overload]
    request_id = stream.response.headers["x-request-id"]
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 6
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1].response
    usage = completed.usage
    prompt = usage.input_tokens
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert completed.output[0].content[0].text == text
    assert usage.input_tokens_details.cached_tokens == hit(prompt)
    assert Decimal(extra(usage, "cost")) == demo_cost(prompt, hit(prompt), 6)
    check_row(row_of(stack, request_id), "/v1/responses", prompt - hit(prompt), hit(prompt), 6)
    assert warm.usage is not None and warm.usage.input_tokens_details.cached_tokens == 0
    seen = Seen()
    saw_response(seen, warm.usage.model_dump())
    saw_response(seen, usage.model_dump())
    check_statement(stack, tenant, seen)


NODE_CLIENT = Path(__file__).parents[1] / "node"


def test_the_openai_node_sdk_streams_responses_with_cached_tokens_and_their_cost(
    stack: Stack,
) -> None:
    """The official openai Node SDK (tests/node, installed by make test-deps): a repeated
    prompt streamed through ``responses.create`` reads its cache and is billed exactly."""
    node = shutil.which("node")
    assert node is not None and (NODE_CLIENT / "node_modules" / "openai").is_dir(), (
        "the Node client is installed by make test-deps"
    )
    tenant = fresh(stack, "node")
    env = {**os.environ, "KVGATE_BASE_URL": stack.base_url, "KVGATE_API_KEY": stack.keys[tenant]}
    system = "You are the Node SDK's test assistant; answer in one line. " * 12
    argv = [node, str(NODE_CLIENT / "responses_stream.mjs"), SOLO, system, "node, streamed", "7"]
    runs = [
        json.loads(
            subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=60, check=True
            ).stdout
        )
        for _ in range(2)
    ]
    first, second = (run["completed"]["usage"] for run in runs)
    prompt = first["input_tokens"]
    assert first["input_tokens_details"]["cached_tokens"] == 0
    assert second["input_tokens_details"]["cached_tokens"] == hit(prompt)
    seen = Seen()
    for run, usage, cached in ((runs[0], first, 0), (runs[1], second, hit(prompt))):
        types = run["types"]
        assert types[0] == "response.created" and types[-1] == "response.completed"
        assert types.count("response.output_text.delta") == 7
        assert run["completed"]["output"][0]["content"][0]["text"] == run["text"]
        assert (usage["input_tokens"], usage["output_tokens"]) == (prompt, 7)
        assert Decimal(usage["cost"]) == demo_cost(prompt, cached, 7)
        check_row(row_of(stack, run["requestId"]), "/v1/responses", prompt - cached, cached, 7)
        saw_response(seen, usage)
    check_statement(stack, tenant, seen)


def test_a_follow_up_goes_to_the_replica_that_stored_its_response(stack: Stack) -> None:
    client = oai(stack)
    first = client.responses.create(
        model=PAIR, input="remember this: " + SYSTEM, max_output_tokens=3
    )
    home = row_of(stack, first._request_id).upstream  # type: ignore[attr-defined]
    previous = first
    for turn in range(4):
        follow = client.responses.create(
            model=PAIR,
            input=f"and then, turn {turn}",
            previous_response_id=previous.id,
            max_output_tokens=3,
        )
        row = row_of(stack, follow._request_id)  # type: ignore[attr-defined]
        assert row.upstream == home
        # The replica rendered the stored conversation before the new input: it is cached.
        assert follow.usage is not None and previous.usage is not None
        assert follow.usage.input_tokens > previous.usage.input_tokens
        assert follow.usage.input_tokens_details.cached_tokens > 0
        previous = follow
    # The replica goes away, and the conversation with it: a clear 404, never another
    # replica's answer without the history.
    sim = next(s for s in stack.sims if s.url == home)
    sim.stop()
    for _ in range(2):  # the first finds it gone on connecting; the next knows it already
        with pytest.raises(openai.NotFoundError) as gone:
            client.responses.create(
                model=PAIR, input="still there?", previous_response_id=previous.id
            )
        assert gone.value.body["code"] == "previous_response_unavailable"  # type: ignore[index]
        assert gone.value.body["param"] == "previous_response_id"  # type: ignore[index]
    # A request that continues nothing is served by the other replica.
    assert client.responses.create(model=PAIR, input="fresh", max_output_tokens=2).output_text


def test_responses_errors_are_openai_shaped(stack: Stack) -> None:
    client = oai(stack)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="no-such-model", input="x")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=SOLO, input=[{"role": "user", "content": 7}])  # type: ignore[list-item]
    assert bad.value.body["param"] == "input[0].content"  # type: ignore[index]


# -- /v1/embeddings ----------------------------------------------------------------------


def test_embeddings_create_is_priced_at_the_input_rate(stack: Stack) -> None:
    client = oai(stack)
    reply = client.embeddings.create(model=SOLO, input="an embedded sentence of kvgate")
    assert len(reply.data) == 1 and len(reply.data[0].embedding) == 16
    prompt = reply.usage.prompt_tokens
    assert prompt == 5 and reply.usage.total_tokens == prompt
    assert Decimal(extra(reply.usage, "cost")) == demo_cost(prompt, 0, 0)
    check_row(row_of(stack, reply._request_id), "/v1/embeddings", prompt, 0, 0)  # type: ignore[attr-defined]
    several = client.embeddings.create(
        model=SOLO, input=["one two", "three"], encoding_format="float"
    )
    assert [d.index for d in several.data] == [0, 1] and several.usage.prompt_tokens == 3

    async def embed() -> Any:
        client = AsyncOpenAI(base_url=stack.base_url, api_key=stack.keys["alpha"], max_retries=0)
        return await client.embeddings.with_raw_response.create(
            model=SOLO, input=["one two", "three"]
        )

    raw = asyncio.run(embed())  # the async client: base64 vectors by default, as the sync one
    awaited = raw.parse()
    assert [len(d.embedding) for d in awaited.data] == [16, 16]
    assert awaited.data[0].embedding == pytest.approx(several.data[0].embedding, abs=1e-6)
    assert awaited.usage.prompt_tokens == 3
    assert Decimal(extra(awaited.usage, "cost")) == demo_cost(3, 0, 0)
    assert raw.headers["x-kvgate-cost"] == extra(awaited.usage, "cost")
    check_row(row_of(stack, raw.headers["x-request-id"]), "/v1/embeddings", 3, 0, 0)
    # /metrics counts requests by endpoint.
    status, _, body = call(stack.url + "/metrics")
    assert status == 200
    assert f'kvgate_requests_total{{endpoint="/v1/embeddings",model="{SOLO}",'.encode() in body


def test_another_endpoints_members_of_any_type_are_passed_on_unread(stack: Stack) -> None:
    """`stream`, `stream_options` and `metadata` where the endpoint has none: neither a 500
    (they were read as if declared) nor a stream answered as a broken SSE one."""
    key = stack.keys["alpha"]
    odd = {"stream": True, "stream_options": "x", "metadata": 5}
    status, headers, body = call(
        stack.url + "/v1/embeddings",
        json.dumps({"model": SOLO, "input": "an embedded sentence of kvgate", **odd}).encode(),
        {"Authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    assert status == 200 and headers["content-type"] == "application/json", body
    usage = json.loads(body)["usage"]
    assert usage["prompt_tokens"] == 5 and Decimal(usage["cost"]) == demo_cost(5, 0, 0)
    assert headers["x-kvgate-cost"] == usage["cost"]
    check_row(row_of(stack, headers["x-request-id"]), "/v1/embeddings", 5, 0, 0)
    counted = {"model": SOLO, "messages": [{"role": "user", "content": "count me"}], **odd}
    status, headers, body = call(
        stack.url + "/v1/messages/count_tokens",
        json.dumps(counted).encode(),
        {"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json"},
    )
    assert status == 200 and headers["content-type"] == "application/json", body
    assert json.loads(body)["input_tokens"] == 4


# -- /v1/messages, /v1/messages/count_tokens --------------------------------------------

# A system prompt of their own: the Responses tests' instructions render as the same
# system message, so they would share its cached blocks.
MESSAGES_SYSTEM = "Messages: " + SYSTEM
SYSTEM_BLOCKS = [{"type": "text", "text": MESSAGES_SYSTEM, "cache_control": {"type": "ephemeral"}}]


def test_messages_create_with_cache_control_reads_the_cache_and_is_priced(stack: Stack) -> None:
    tenant = fresh(stack, "messages")
    client = claude(stack, tenant)
    asked: dict[str, Any] = {
        "model": SOLO,
        "max_tokens": 5,
        "system": SYSTEM_BLOCKS,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "messages, sync"}]}],
    }
    first = client.messages.create(**asked)
    second = client.messages.create(**asked)
    assert first.content[0].text == second.content[0].text  # type: ignore[union-attr]
    assert first.stop_reason == "max_tokens"
    prompt = first.usage.input_tokens
    assert first.usage.cache_read_input_tokens == 0
    cached = hit(prompt)
    # Anthropic's convention: input_tokens leaves out what was read from cache.
    assert (second.usage.input_tokens, second.usage.cache_read_input_tokens) == (
        prompt - cached,
        cached,
    )
    assert second.usage.cache_creation_input_tokens == 0
    assert Decimal(extra(second.usage, "cost")) == demo_cost(prompt, cached, 5)
    seen = Seen()
    for reply in (first, second):
        saw_message(seen, reply.usage.model_dump())
    check_statement(stack, tenant, seen)  # counting tokens is not billed
    counted = client.messages.count_tokens(
        model=SOLO,
        system=SYSTEM_BLOCKS,
        messages=asked["messages"],  # type: ignore[arg-type]
    )
    assert counted.input_tokens == prompt
    check_statement(stack, tenant, seen)


def test_messages_stream_relays_anthropic_events_and_bills_message_delta(stack: Stack) -> None:
    tenant = fresh(stack, "streamed-messages")
    client = claude(stack, tenant)
    asked: dict[str, Any] = {
        "model": SOLO,
        "max_tokens": 4,
        "system": SYSTEM_BLOCKS,
        "messages": [{"role": "user", "content": "messages, streamed"}],
    }
    warm = client.messages.create(**asked)  # warms the cache
    stream = client.messages.create(stream=True, **asked)
    request_id = stream.response.headers["x-request-id"]
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 4,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    usage = events[-2].usage  # type: ignore[union-attr]
    start = events[0].message.usage  # type: ignore[union-attr]
    prompt = start.input_tokens + (start.cache_read_input_tokens or 0)
    assert usage.cache_read_input_tokens == hit(prompt)
    assert usage.input_tokens == prompt - hit(prompt) and usage.output_tokens == 4
    assert Decimal(extra(usage, "cost")) == demo_cost(prompt, hit(prompt), 4)
    check_row(row_of(stack, request_id), "/v1/messages", prompt - hit(prompt), hit(prompt), 4)
    assert warm.usage.cache_read_input_tokens == 0
    seen = Seen()
    saw_message(seen, warm.usage.model_dump())
    # The stream's bill is message_delta's usage (message_start's has no cost yet).
    saw_message(seen, usage.model_dump())
    check_statement(stack, tenant, seen)


def test_messages_errors_are_anthropic_shaped(stack: Stack) -> None:
    client = claude(stack)
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(
            model="no-such-model", max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
    assert missing.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "The model 'no-such-model' does not exist"},
    }
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=SOLO, max_tokens=2, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "'messages'" in bad.value.body["error"]["message"]  # type: ignore[index]
    refused = anthropic.Anthropic(base_url=stack.url, api_key="kvg-not-a-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        refused.messages.count_tokens(model=SOLO, messages=[{"role": "user", "content": "x"}])
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    status, _, body = call(
        stack.url + "/v1/messages",
        b'{"model": "solo-llama", "max_tokens": "two", "messages": []}',
        {"x-api-key": stack.keys["alpha"], "anthropic-version": "2023-06-01"},
    )
    assert status == 400 and json.loads(body)["type"] == "error"


# -- the statement -----------------------------------------------------------------------


def test_the_statement_has_a_line_per_endpoint_with_the_costs_seen(stack: Stack) -> None:
    """A fresh tenant: every endpoint's costs, as the clients saw them, on its own lines."""
    tenant = fresh(stack, "gamma")
    seen = Seen()
    client = oai(stack, tenant)
    for _ in range(2):
        r = client.responses.create(
            model=SOLO, instructions=SYSTEM, input="bill", max_output_tokens=3
        )
        assert r.usage is not None
        saw_response(seen, r.usage.model_dump())
        e = client.embeddings.create(model=SOLO, input="bill me")
        seen.add(
            "/v1/embeddings",
            uncached=e.usage.prompt_tokens,
            cached=0,
            output=0,
            cost=extra(e.usage, "cost"),
        )
        m = claude(stack, tenant).messages.create(
            model=SOLO, max_tokens=3, system=SYSTEM, messages=[{"role": "user", "content": "bill"}]
        )
        saw_message(seen, m.usage.model_dump())
    check_statement(stack, tenant, seen)
    assert sorted(seen.lines) == ["/v1/embeddings", "/v1/messages", "/v1/responses"]
    assert seen.lines["/v1/responses"].tokens["cache_read_tokens"] > 0
    assert seen.lines["/v1/messages"].tokens["cache_read_tokens"] > 0
