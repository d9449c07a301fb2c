"""The gateway end to end: official openai client → kvgate serve → kvgate sim replicas.

Costs are checked against an independent computation from the catalog's rates: the demo
model's entry in force since 2026-07-01 is input 0.15, cache read 0.015, output 0.45 USD
per million tokens.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from sqlalchemy import select

from gateway.db.models import RequestRow
from gateway.serving.calls import Endpoint
from tests.e2e.conftest import ADMIN_TOKEN, DOWN, MODEL, SOLO, UNPRICED
from tests.factories import demo_cost
from tests.support.processes import call, kvgate, wait_recorded
from tests.support.stack import Stack

pytestmark = pytest.mark.e2e

USER_X = b'"messages": [{"role": "user", "content": "x"}]'
SYSTEM = "You are the kvgate test assistant. Answer briefly and precisely. " * 12


def client(stack: Stack, tenant: str = "alpha") -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key=stack.keys[tenant], max_retries=0)


def messages(user: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def rows(stack: Stack, **where: Any) -> list[RequestRow]:
    wait_recorded(stack.url)
    with stack.engine.connect() as connection:
        query = select(RequestRow)
        for name, value in where.items():
            query = query.where(getattr(RequestRow, name) == value)
        return list(connection.execute(query))  # type: ignore[arg-type]


def raw(
    stack: Stack,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    return call(stack.url + path, body, headers, method)


def test_models_list(stack: Stack) -> None:
    assert sorted(m.id for m in client(stack).models.list()) == sorted(
        [MODEL, SOLO, DOWN, UNPRICED]
    )
    # Each model says which endpoints serve it (all four here are vLLM deployments).
    _, _, body = raw(
        stack, "/v1/models", headers={"Authorization": f"Bearer {stack.keys['alpha']}"}
    )
    for card in json.loads(body)["data"]:
        assert card["endpoints"] == [e.value for e in Endpoint]


def test_models_retrieve(stack: Stack) -> None:
    c = client(stack)
    card = c.models.retrieve(MODEL)  # an id holding '/': kvgate/demo-llama-8b
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "kvgate")
    assert card.endpoints == [e.value for e in Endpoint]  # type: ignore[attr-defined]
    assert card.created == next(m.created for m in c.models.list() if m.id == MODEL)
    with pytest.raises(openai.NotFoundError) as missing:
        c.models.retrieve("no-such-model")
    assert missing.value.body == {
        "message": "The model 'no-such-model' does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    status, headers, body = raw(stack, "/v1/models/" + MODEL)
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    status, headers, _ = raw(
        stack, "/v1/models/" + MODEL, b"{}", {"Authorization": f"Bearer {stack.keys['alpha']}"}
    )
    assert status == 405 and headers["allow"] == "GET"


def test_second_identical_prompt_is_served_from_cache_and_priced_so(stack: Stack) -> None:
    c = client(stack)
    first = c.chat.completions.create(model=SOLO, messages=messages("first question"), max_tokens=5)
    second = c.chat.completions.create(
        model=SOLO, messages=messages("first question"), max_tokens=5
    )
    assert first.usage and second.usage
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    # Every full 16-token block but the one holding the last prompt token.
    assert cached == (second.usage.prompt_tokens - 1) // 16 * 16
    for reply in (first, second):
        usage = reply.usage
        assert usage is not None
        cost = demo_cost(
            usage.prompt_tokens,
            usage.prompt_tokens_details.cached_tokens,  # type: ignore[union-attr]
            usage.completion_tokens,
        )
        assert Decimal(usage.cost) == cost  # type: ignore[attr-defined]
    (row,) = rows(stack, request_id=second._request_id)
    assert (row.cache_read_tokens, row.uncached_tokens, row.output_tokens) == (
        cached,
        second.usage.prompt_tokens - cached,
        5,
    )
    assert row.status == "completed" and row.price_id == "kvgate/demo-llama-8b@2026-07-01T00:00:00Z"
    assert row.cost_total == Decimal(second.usage.cost)  # type: ignore[attr-defined]


def test_a_reply_carries_its_cost_and_cached_tokens_in_headers(stack: Stack) -> None:
    c = client(stack).chat.completions.with_raw_response
    for _ in range(2):
        raw_reply = c.create(model=SOLO, messages=messages("header question"), max_tokens=3)
    reply = raw_reply.parse()
    assert reply.usage is not None
    cached = reply.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached > 0
    assert raw_reply.headers["x-kvgate-cached-tokens"] == str(cached)
    assert raw_reply.headers["x-kvgate-cost"] == reply.usage.cost  # type: ignore[attr-defined]
    assert Decimal(raw_reply.headers["x-kvgate-cost"]) == demo_cost(
        reply.usage.prompt_tokens, cached, reply.usage.completion_tokens
    )


def test_every_response_carries_a_request_id(stack: Stack) -> None:
    reply = client(stack).chat.completions.with_raw_response.create(
        model=SOLO, messages=messages("id please"), max_tokens=2
    )
    assert reply.headers["x-request-id"].startswith("req_")
    status, headers, _ = raw(stack, "/v1/models")
    assert status == 401 and headers["x-request-id"].startswith("req_")


def test_completions_sync_async_and_streaming(stack: Stack) -> None:
    c = client(stack)
    text = c.completions.create(model=SOLO, prompt="Once upon a time", max_tokens=4)
    assert text.usage is not None and text.usage.completion_tokens == 4
    assert len(text.choices[0].text.split()) == 4

    async def run_async() -> tuple[Any, list[str]]:
        ac = AsyncOpenAI(base_url=stack.base_url, api_key=stack.keys["alpha"], max_retries=0)
        reply = await ac.chat.completions.create(
            model=MODEL, messages=messages("async"), max_tokens=3
        )
        stream = await ac.completions.create(
            model=MODEL, prompt="async stream", max_tokens=3, stream=True
        )
        pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
        await ac.close()
        return reply, pieces

    reply, pieces = asyncio.run(run_async())
    assert reply.usage.completion_tokens == 3 and len(pieces) == 3


def test_stream_without_include_usage_shows_no_usage_chunk(stack: Stack) -> None:
    chunks = list(
        client(stack).chat.completions.create(
            model=SOLO, messages=messages("stream me"), max_tokens=4, stream=True
        )
    )
    assert all(chunk.usage is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks).count(" ") >= 3


def test_stream_with_include_usage_ends_with_priced_usage(stack: Stack) -> None:
    c = client(stack)
    prompt = messages("stream with usage")
    c.chat.completions.create(model=SOLO, messages=prompt, max_tokens=2)  # warm the cache
    response = c.chat.completions.with_raw_response.create(
        model=SOLO,
        messages=prompt,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    request_id = response.headers["x-request-id"]
    chunks = list(response.parse())
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.completion_tokens == 6
    cached = usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached > 0
    assert Decimal(usage.cost) == demo_cost(usage.prompt_tokens, cached, 6)  # type: ignore[attr-defined]
    (row,) = rows(stack, request_id=request_id)
    assert row.stream and row.status == "completed" and row.first_token_at is not None
    assert (row.cache_read_tokens, row.output_tokens, row.finish_reason) == (cached, 6, "length")


def test_tenant_b_gets_no_cache_hit_on_tenant_a_prompt(stack: Stack) -> None:
    prompt = messages("a secret only alpha has asked about")
    a, b = client(stack, "alpha"), client(stack, "beta")
    a.chat.completions.create(model=SOLO, messages=prompt, max_tokens=2)
    again = a.chat.completions.create(model=SOLO, messages=prompt, max_tokens=2)
    other = b.chat.completions.create(model=SOLO, messages=prompt, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # type: ignore[union-attr]
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]


def test_a_client_salt_never_reaches_another_tenant(stack: Stack) -> None:
    prompt = messages("salted prompt", system="A system prompt used only by the salt test. " * 8)
    extra = {"cache_salt": "shared-by-both-clients"}
    client(stack, "alpha").chat.completions.create(
        model=SOLO, messages=prompt, max_tokens=2, extra_body=extra
    )
    other = client(stack, "beta").chat.completions.create(
        model=SOLO, messages=prompt, max_tokens=2, extra_body=extra
    )
    mine = client(stack, "alpha").chat.completions.create(
        model=SOLO, messages=prompt, max_tokens=2, extra_body=extra
    )
    unsalted = client(stack, "alpha").chat.completions.create(
        model=SOLO, messages=prompt, max_tokens=2
    )
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    assert mine.usage.prompt_tokens_details.cached_tokens > 0  # type: ignore[union-attr]
    assert unsalted.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]


def test_interaction_header_and_metadata_group_requests(stack: Stack) -> None:
    c = client(stack)
    one = c.chat.completions.with_raw_response.create(
        model=SOLO,
        messages=messages("turn 1"),
        max_tokens=2,
        extra_headers={"X-Interaction-Id": "conv-42"},
    )
    two = c.chat.completions.with_raw_response.create(
        model=SOLO,
        messages=messages("turn 2"),
        max_tokens=2,
        extra_body={"metadata": {"interaction_id": "conv-43"}},
    )
    three = c.chat.completions.with_raw_response.create(
        model=SOLO, messages=messages("t3"), max_tokens=2
    )
    ids = {r.interaction_id for r in rows(stack, request_id=one.headers["x-request-id"])}
    assert ids == {"conv-42"}
    assert {r.interaction_id for r in rows(stack, request_id=two.headers["x-request-id"])} == {
        "conv-43"
    }
    rid = three.headers["x-request-id"]
    assert {r.interaction_id for r in rows(stack, request_id=rid)} == {rid}


@pytest.mark.parametrize("case", ["missing", "wrong", "malformed"])
def test_bad_keys_get_401_in_openai_shape(stack: Stack, case: str) -> None:
    headers = {
        "missing": {},
        "wrong": {"Authorization": "Bearer kvg-nope"},
        "malformed": {"Authorization": "Token abc"},
    }[case]
    status, response_headers, body = raw(
        stack, "/v1/chat/completions", b"{}", {"content-type": "application/json", **headers}
    )
    error = json.loads(body)["error"]
    assert status == 401 and error["type"] == "authentication_error"
    assert error["code"] == "invalid_api_key" and error["message"]
    assert "x-request-id" in response_headers


def test_openai_client_raises_authentication_error(stack: Stack) -> None:
    bad = OpenAI(base_url=stack.base_url, api_key="kvg-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=SOLO, messages=messages("x"), max_tokens=1)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b"", 400, None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
        (b'{"model": 7, "messages": []}', 400, "model"),
        (b'{"model": "solo-llama", "messages": "hi"}', 400, "messages"),
        (b'{"model": "solo-llama", "messages": [{"content": "x"}]}', 400, "messages[0].role"),
        (
            b'{"model": "solo-llama", ' + USER_X + b', "max_tokens": "5"}',
            400,
            "max_tokens",
        ),
        (
            b'{"model": "solo-llama", ' + USER_X + b', "max_tokens": 0}',
            400,
            "max_tokens",
        ),
        (
            b'{"model": "solo-llama", ' + USER_X + b', "stream": "yes"}',
            400,
            "stream",
        ),
        (
            b'{"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "model",
        ),
        (
            b'{"model": "solo-llama", "messages": [{"role": "user", "content": "'
            + b"x" * 70_000
            + b'"}]}',
            413,
            None,
        ),
        (b"[" * 5000 + b"]" * 5000, 400, None),
    ],
)
def test_bad_input_gets_a_clear_openai_error_never_a_500(
    stack: Stack, body: bytes, status: int, param: str | None
) -> None:
    got, _, reply = raw(
        stack,
        "/v1/chat/completions",
        body,
        {"Authorization": f"Bearer {stack.keys['alpha']}", "content-type": "application/json"},
    )
    error = json.loads(reply)["error"]
    assert got == status, error
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"


def test_upstream_down_gives_503_and_a_failed_record(stack: Stack) -> None:
    c = client(stack)
    with pytest.raises(openai.APIStatusError) as raised:
        c.chat.completions.with_raw_response.create(
            model=DOWN, messages=messages("x"), max_tokens=1
        )
    # Unreachable when tried, or already out (a health check or an earlier test saw it down).
    gone = ("unreachable", "no healthy replica")
    assert raised.value.status_code == 503
    assert any(reason in raised.value.message for reason in gone)
    request_id = raised.value.response.headers["x-request-id"]
    (row,) = rows(stack, request_id=request_id)
    assert row.status == "failed" and row.cost_total == 0
    assert row.error is not None and any(reason in row.error for reason in gone)
    # Now it is out until a health check passes: the next request fails fast, on record too.
    with pytest.raises(openai.APIStatusError) as again:
        c.chat.completions.with_raw_response.create(
            model=DOWN, messages=messages("x"), max_tokens=1
        )
    assert again.value.status_code == 503 and "no healthy replica" in again.value.message
    (row,) = rows(stack, request_id=again.value.response.headers["x-request-id"])
    assert row.status == "failed" and row.upstream == "" and row.attempt == 1


def test_revoked_key_is_refused(stack: Stack) -> None:
    key = stack.tenant("gamma")
    key_id = stack.key_ids["gamma"]
    gamma = OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    assert gamma.chat.completions.create(model=SOLO, messages=messages("hi"), max_tokens=1)
    kvgate("keys", "revoke", key_id, env=stack.env)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            gamma.chat.completions.create(model=SOLO, messages=messages("hi"), max_tokens=1)
        except openai.AuthenticationError:
            return
        time.sleep(0.2)
    pytest.fail("revoked key still accepted after 5 s")


def test_statement_matches_the_sum_of_returned_costs(stack: Stack) -> None:
    """A fresh tenant: every cost the client saw, summed, is the statement total."""
    key = stack.tenant("delta")
    c = OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    seen = Decimal(0)
    tokens = {"uncached": 0, "cached": 0, "output": 0}
    for n in range(6):
        reply = c.chat.completions.create(
            model=SOLO,
            messages=messages(f"q{n % 2}"),
            max_tokens=3 + n,
            extra_headers={"X-Interaction-Id": f"conv-{n % 3}"},
        )
        usage = reply.usage
        assert usage is not None
        cached = usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
        seen += Decimal(usage.cost)  # type: ignore[attr-defined]
        assert Decimal(usage.cost) == demo_cost(
            usage.prompt_tokens, cached, usage.completion_tokens
        )  # type: ignore[attr-defined]
        tokens["uncached"] += usage.prompt_tokens - cached
        tokens["cached"] += cached
        tokens["output"] += usage.completion_tokens
    wait_recorded(stack.url)
    today = datetime.now(UTC).date()
    status, headers, body = raw(
        stack,
        f"/v1/billing/statement?start={today}&end={today}&format=json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert status == 200, body
    statement = json.loads(body)
    assert statement["tenant"]["name"] == "delta"
    totals = statement["totals"]
    assert Decimal(totals["cost_total"]) == seen
    assert (totals["uncached_tokens"], totals["cache_read_tokens"], totals["output_tokens"]) == (
        tokens["uncached"],
        tokens["cached"],
        tokens["output"],
    )
    assert totals["requests"] == 6 and totals["completed_interactions"] == 3
    (line,) = statement["line_items"]
    assert (line["model"], line["input_rate"], line["cache_read_rate"], line["output_rate"]) == (
        SOLO,
        "0.150000000",
        "0.015000000",
        "0.450000000",
    )
    status, headers, body = raw(
        stack,
        f"/v1/billing/statement?start={today}&end={today}&format=csv",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert status == 200 and headers["content-type"].startswith("text/csv")
    header, *_, total = body.decode().splitlines()
    assert (
        dict(zip(header.split(","), total.split(","), strict=True))["cost_total"]
        == (totals["cost_total"])
    )
    # The admin endpoint returns the same bytes for the same tenant and period.
    status, _, admin_body = raw(
        stack,
        f"/v1/admin/statement?tenant=delta&start={today}&end={today}&format=csv",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert status == 200 and admin_body == body


def test_admin_endpoints_refuse_tenant_keys(stack: Stack) -> None:
    today = date.today()
    status, _, body = raw(
        stack,
        f"/v1/admin/statement?tenant=alpha&start={today}&end={today}",
        headers={"Authorization": f"Bearer {stack.keys['alpha']}"},
    )
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"


def test_statement_query_errors_are_openai_shaped(stack: Stack) -> None:
    auth = {"Authorization": f"Bearer {stack.keys['alpha']}"}
    for query in (
        "start=2026-13-01&end=2026-12-01",
        "start=2026-12-02&end=2026-12-01",
        "end=2026-12-01",
        "start=2026-01-01&end=2026-01-02&format=xml",
    ):
        status, _, body = raw(stack, f"/v1/billing/statement?{query}", headers=auth)
        assert status == 400, (query, body)
        assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_metrics_count_requests_tokens_and_cost(stack: Stack) -> None:
    client(stack).chat.completions.create(model=SOLO, messages=messages("metrics"), max_tokens=2)
    status, _, body = raw(stack, "/metrics")
    text = body.decode()
    assert status == 200
    for name in (
        "kvgate_requests_total",
        "kvgate_tokens_total",
        "kvgate_cost_usd_total",
        "kvgate_ttft_seconds_bucket",
        "kvgate_request_duration_seconds_bucket",
        "kvgate_recorder_backlog",
        "kvgate_journal_bytes",
        "kvgate_replica_up",
    ):
        assert name in text, name
    assert (
        f'kvgate_requests_total{{endpoint="/v1/chat/completions",model="{SOLO}",'
        f'status="completed",upstream="{stack.sims[2].url}"}}' in text
    )


def test_a_model_without_a_price_is_served_and_recorded_unpriced(stack: Stack) -> None:
    reply = client(stack, "beta").chat.completions.with_raw_response.create(
        model=UNPRICED, messages=messages("no price"), max_tokens=3
    )
    usage = reply.parse().usage
    assert usage is not None and usage.completion_tokens == 3
    assert usage.cost is None  # type: ignore[attr-defined]
    # No cost to state in a header either; the cached tokens all the same.
    assert "x-kvgate-cost" not in reply.headers
    assert reply.headers["x-kvgate-cached-tokens"] == str(
        usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    )
    (row,) = rows(stack, request_id=reply.headers["x-request-id"])
    assert row.status == "completed" and row.price_id is None and row.cost_total == 0
    assert row.uncached_tokens + row.cache_read_tokens == usage.prompt_tokens
    _, _, body = raw(stack, "/metrics")
    unpriced = f'endpoint="/v1/chat/completions",model="{UNPRICED}"'
    assert f"kvgate_unpriced_requests_total{{{unpriced}}} 1.0" in body.decode()
    today = datetime.now(UTC).date()
    _, _, statement = raw(
        stack,
        f"/v1/billing/statement?start={today}&end={today}",
        headers={"Authorization": f"Bearer {stack.keys['beta']}"},
    )
    lines = [item for item in json.loads(statement)["line_items"] if item["model"] == UNPRICED]
    # Said unpriced, with no cost and no currency: never 0 in an assumed one.
    assert [
        (
            item["price_id"],
            item["priced"],
            item["requests"],
            item["cost_total"],
            item["currency"],
            item["input_rate"],
        )
        for item in lines
    ] == [(None, False, 1, None, None, None)]
    # The CLI prints the API's bytes, unpriced lines and all.
    for fmt in ("json", "csv"):
        _, _, api = raw(
            stack,
            f"/v1/billing/statement?start={today}&end={today}&format={fmt}",
            headers={"Authorization": f"Bearer {stack.keys['beta']}"},
        )
        period = ["--start", str(today), "--end", str(today), "--format", fmt]
        printed = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "billing",
                "statement",
                "--tenant",
                "beta",
                *period,
            ],
            env=stack.env,
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout
        assert printed == api, fmt


def test_wrong_method_on_an_inference_path_is_an_openai_405(stack: Stack) -> None:
    status, headers, body = raw(
        stack,
        "/v1/chat/completions",
        method="GET",
        headers={"Authorization": f"Bearer {stack.keys['alpha']}"},
    )
    error = json.loads(body)["error"]
    assert status == 405 and error["code"] == "method_not_allowed" and "POST" in error["message"]
    assert headers["x-request-id"].startswith("req_")
