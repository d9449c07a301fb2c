"""Spend control live, on SQLite and Postgres: `kvgate serve` in front of `kvgate sim`, the
official openai client, budgets and limits set through the CLI and the admin API.

A zero budget blocks with 402 in OpenAI's shape; an interaction budget stops a looping
agent at its cap; rate limits answer 429 with OpenAI's x-ratelimit-* headers; thresholds
fire exactly once each, signed, to a receiver on loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from sqlalchemy import select

from gateway.db.models import BudgetAlertRow, BudgetCounterRow, RequestRow
from gateway.db.session import session_factory
from tests.conftest import _backends, new_database
from tests.factories import vllm
from tests.support.processes import kvgate
from tests.support.stack import SIM_MODEL, Stack, running_stack

pytestmark = pytest.mark.e2e
ADMIN = "test-admin-token"
SECRET = "spend-test-secret-0123456789"
ASK = [{"role": "user", "content": "How much is left?"}]
SLOW = "slow-llama"  # 20 tokens a second: a stream a client can leave
CAPPED = "capped-llama"  # default_max_tokens: 5


@pytest.fixture(scope="module", params=_backends())
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("spend")
    with (
        new_database(request.param, tmp) as database_url,
        running_stack(
            tmp,
            database_url,
            tenants=(
                "zero",
                "agent",
                "limited",
                "alerted",
                "leaver",
                "capped",
                "free",
                "attributed",
                "claude",
                "claude_limited",
            ),
            KVGATE_ADMIN_TOKEN=ADMIN,
            KVGATE_SECRET=SECRET,
        ) as stack,
    ):
        [instant] = stack.start_sims(1)
        [slow] = stack.start_sims(1, extra=("--decode-tokens-per-s", "20"))
        stack.configure(
            [
                vllm(SIM_MODEL, [instant.url]),
                vllm(SLOW, [slow.url], price_model=SIM_MODEL, upstream_model=SIM_MODEL),
                vllm(
                    CAPPED,
                    [instant.url],
                    price_model=SIM_MODEL,
                    upstream_model=SIM_MODEL,
                    default_max_tokens=5,
                ),
            ]
        )
        stack.start_gateway()
        yield stack


def admin(stack: Stack, method: str, path: str, **body: Any) -> Any:
    reply = httpx.request(
        method,
        stack.url + path,
        json=body or None,
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert reply.status_code < 300, reply.text
    return reply.json()


def ask(stack: Stack, tenant: str, **options: Any) -> Any:
    return stack.client(tenant).chat.completions.create(
        model=SIM_MODEL, messages=options.pop("messages", ASK), max_tokens=8, **options
    )


def tomorrow() -> str:
    day = datetime.now(UTC).date() + timedelta(days=1)
    return f"{day.isoformat()}T00:00:00Z"


def test_a_zero_budget_blocks_with_402_in_openais_shape_and_a_refused_record(
    stack: Stack,
) -> None:
    out = kvgate(
        "budgets",
        "set",
        "--scope",
        "tenant:zero",
        "--limit",
        "0",
        "--period",
        "day",
        env=stack.env,
    )
    budget_id = out.stdout.split()[1].rstrip(":")
    with pytest.raises(openai.APIStatusError) as refused:
        ask(stack, "zero")
    assert refused.value.status_code == 402
    error = refused.value.response.json()["error"]
    assert error == {
        "type": "insufficient_quota",
        "code": "budget_exceeded",
        "message": (
            f"budget {budget_id} on tenant:zero (day) cannot cover this request: limit 0;"
            f" it resets {tomorrow()}"
        ),
        "param": None,
    }
    [row] = stack.rows(RequestRow.tenant_id == stack.tenant_ids["zero"], count=1)
    assert (row.status, row.cost_total, row.output_tokens, row.upstream) == (
        "refused",
        Decimal(0),
        0,
        "",
    )
    listed = kvgate("budgets", "list", env=stack.env).stdout
    assert f"{budget_id}\ttenant:zero\t" in listed
    kvgate("budgets", "delete", budget_id, env=stack.env)
    assert ask(stack, "zero").usage.completion_tokens > 0  # at once: nothing blocks now


def test_user_and_tag_budgets_charge_only_the_requests_that_carry_them(stack: Stack) -> None:
    """A spent end user (OpenAI's ``user``) or tag (X-Kvgate-Tags or ``metadata``) is
    refused; the tenant's other users and tags are not; a user's spend is its records'."""
    for scope in ("user:attributed/bob", "tag:attributed/team=search"):
        admin(stack, "POST", "/v1/admin/budgets", scope=scope, limit="0", period="month")
    out = kvgate(
        "budgets",
        "set",
        "--scope",
        "user:attributed/carol",
        "--limit",
        "1",
        "--period",
        "day",
        env=stack.env,
    )
    carol_budget = out.stdout.split()[1].rstrip(":")
    refused = [
        {"user": "bob"},
        {"extra_headers": {"x-kvgate-tags": "team=search"}},
        {"metadata": {"team": "search"}, "user": "alice"},
    ]
    for options in refused:
        with pytest.raises(openai.APIStatusError) as stopped:
            ask(stack, "attributed", **options)
        assert stopped.value.status_code == 402, options
        assert stopped.value.response.json()["error"]["code"] == "budget_exceeded"
    message = stopped.value.response.json()["error"]["message"]
    assert " on tag:attributed/team=search (month) " in message
    answered = [
        {"user": "alice"},
        {"user": "carol", "metadata": {"team": "ads"}},
        {"extra_headers": {"x-kvgate-tags": "team=ads"}},
        {},
    ]
    for options in answered:
        assert ask(stack, "attributed", **options).usage.completion_tokens > 0
    rows = stack.rows(RequestRow.tenant_id == stack.tenant_ids["attributed"], count=7)
    assert [r.status for r in rows] == ["refused"] * 3 + ["completed"] * 4
    [carol] = [r for r in rows if r.end_user == "carol"]
    deadline = time.monotonic() + 5
    while True:  # the gateway's slice of carol's budget is flushed within a second or so
        mine = httpx.get(
            stack.url + "/v1/billing/budgets",
            headers={"authorization": f"Bearer {stack.keys['attributed']}"},
        ).json()["data"]
        [listed] = [b for b in mine if b["id"] == carol_budget]
        if Decimal(listed["reserved"]) == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert listed["scope"] == "user:attributed/carol"
    assert (Decimal(listed["spent"]), Decimal(listed["reserved"])) == (carol.cost_total, 0)
    assert {b["scope"] for b in mine} == {
        "user:attributed/bob",
        "user:attributed/carol",
        "tag:attributed/team=search",
    }


def test_an_interaction_budget_stops_a_looping_agent_at_its_cap(stack: Stack) -> None:
    cap = Decimal("0.000150000")
    admin(
        stack,
        "POST",
        "/v1/admin/budgets",
        scope="interaction:agent",
        limit=str(cap),
        period="total",
    )
    messages = list(ASK)
    answered = 0
    with pytest.raises(openai.APIStatusError) as stopped:
        for _ in range(200):
            reply = ask(
                stack, "agent", messages=messages, extra_headers={"x-interaction-id": "loop-1"}
            )
            answered += 1
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": "Again, and more."},
            ]
    assert stopped.value.status_code == 402 and answered >= 2
    rows = stack.rows(RequestRow.interaction_id == "loop-1", count=answered + 1)
    assert [r.status for r in rows] == ["completed"] * answered + ["refused"]
    spent = sum((r.cost_total for r in rows), Decimal(0))
    assert spent <= cap
    with session_factory(stack.engine)() as session:
        counter = session.scalars(
            select(BudgetCounterRow).where(BudgetCounterRow.subject == "loop-1")
        ).one()
    assert (counter.spent, counter.reserved) == (spent, Decimal(0))
    # Another interaction of the same tenant has a cap of its own.
    ask(stack, "agent", extra_headers={"x-interaction-id": "loop-2"})
    # The tenant reads its budgets (an interaction cap shows no one spend).
    mine = httpx.get(
        stack.url + "/v1/billing/budgets",
        headers={"authorization": f"Bearer {stack.keys['agent']}"},
    ).json()["data"]
    assert [(b["scope"], b["limit"], b["spent"]) for b in mine] == [
        ("interaction:agent", str(cap), None)
    ]


def test_rate_limits_answer_429_with_openais_headers(stack: Stack) -> None:
    admin(
        stack,
        "POST",
        "/v1/admin/limits",
        scope=f"key:{stack.key_ids['limited']}",
        requests_per_minute=3,
        tokens_per_minute=1_000_000,
    )
    client = stack.client("limited")
    # Far from a minute's end, so that all four land in one window.
    if datetime.now(UTC).second > 50:
        time.sleep(61 - datetime.now(UTC).second)
    remaining = []
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=ASK, max_tokens=8
        )
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        assert raw.headers["x-ratelimit-limit-tokens"] == "1000000"
        assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
        remaining.append(raw.headers["x-ratelimit-remaining-requests"])
    assert remaining == ["2", "1", "0"]
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model=SIM_MODEL, messages=ASK, max_tokens=8)
    reply = limited.value.response
    assert reply.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(reply.headers["retry-after"]) <= 60
    assert reply.headers["x-ratelimit-remaining-requests"] == "0"
    used = 1_000_000 - int(reply.headers["x-ratelimit-remaining-tokens"])
    rows = stack.rows(RequestRow.tenant_id == stack.tenant_ids["limited"], count=4)
    assert [r.status for r in rows] == ["completed"] * 3 + ["refused"]
    assert used == sum(r.uncached_tokens + r.cache_read_tokens + r.output_tokens for r in rows)


class Receiver(http.server.ThreadingHTTPServer):
    """Webhooks on loopback: every POST's headers and body."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(handler) -> None:
                body = handler.rfile.read(int(handler.headers["content-length"]))
                self.posts.append(({k.lower(): v for k, v in handler.headers.items()}, body))
                handler.send_response(204)
                handler.end_headers()

            def log_message(handler, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


def test_thresholds_fire_exactly_once_each_signed_to_a_webhook(stack: Stack) -> None:
    receiver = Receiver()
    limit = Decimal("0.000060000")
    budget = admin(
        stack,
        "POST",
        "/v1/admin/budgets",
        scope="tenant:alerted",
        limit=str(limit),
        period="month",
        alert_at=["0.2", "0.4", "1.0"],
        webhook=receiver.url,
    )
    refusals = 0
    for _ in range(200):
        try:
            ask(stack, "alerted")
        except openai.APIStatusError as exc:
            assert exc.status_code == 402
            refusals += 1
            if refusals == 3:
                break
    deadline = time.monotonic() + 10
    while len(receiver.posts) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # nothing more comes
    receiver.shutdown()
    assert len(receiver.posts) == 3
    seen = []
    for headers, body in receiver.posts:
        expected = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert headers["x-kvgate-signature"] == expected
        document = orjson.loads(body)
        assert document["budget"]["id"] == budget["id"]
        assert document["limit"] == str(limit)
        assert document["period"]["kind"] == "month"
        seen.append((document["threshold"], Decimal(document["spend"])))
    # 20 % and 40 % by what was spent; 100 % when the budget first refused a request (its
    # spend can only come as close to the limit as a request's largest cost allows).
    assert sorted(t for t, _ in seen) == ["0.2", "0.4", "1.0"]
    for threshold, spent in seen:
        assert spent >= Decimal(threshold) * limit or threshold == "1.0"
    with session_factory(stack.engine)() as session:
        alerts = session.scalars(
            select(BudgetAlertRow).where(BudgetAlertRow.budget_id == budget["id"])
        ).all()
    assert sorted((a.threshold, a.status, a.attempts) for a in alerts) == [
        ("0.2", "delivered", 1),
        ("0.4", "delivered", 1),
        ("1.0", "delivered", 1),
    ]


def test_a_stream_left_midway_is_charged_what_its_record_says(stack: Stack) -> None:
    budget = admin(
        stack, "POST", "/v1/admin/budgets", scope="tenant:leaver", limit="1", period="week"
    )
    with httpx.stream(
        "POST",
        stack.url + "/v1/chat/completions",
        json={"model": SLOW, "messages": ASK, "max_tokens": 200, "stream": True},
        headers={"authorization": f"Bearer {stack.keys['leaver']}"},
    ) as reply:
        lines = reply.iter_lines()
        for line in lines:
            if '"content"' in line and '"content":""' not in line:
                break  # the first token arrived; the client leaves
    [row] = stack.rows(RequestRow.tenant_id == stack.tenant_ids["leaver"], count=1)
    assert row.status == "cancelled" and 0 < row.output_tokens < 200
    deadline = time.monotonic() + 5
    while True:
        [mine] = httpx.get(
            stack.url + "/v1/billing/budgets",
            headers={"authorization": f"Bearer {stack.keys['leaver']}"},
        ).json()["data"]
        if Decimal(mine["reserved"]) == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert mine["id"] == budget["id"]
    assert (Decimal(mine["spent"]), Decimal(mine["reserved"])) == (row.cost_total, 0)
    assert Decimal(mine["remaining"]) == Decimal(1) - row.cost_total


def test_a_budgeted_request_without_max_tokens_is_capped_at_the_deployments_default(
    stack: Stack,
) -> None:
    """Its reservation counted 5 output tokens, so 5 is what the replica was asked for;
    without a budget the body goes as it came (the simulator's own default is 16)."""
    admin(stack, "POST", "/v1/admin/budgets", scope="tenant:capped", limit="1", period="day")
    for tenant, expected in (("capped", 5), ("free", 16)):
        reply = stack.client(tenant).chat.completions.create(model=CAPPED, messages=ASK)
        assert reply.usage.completion_tokens == expected
        assert reply.choices[0].finish_reason == "length"


def test_refusals_on_the_messages_endpoint_answer_in_anthropics_shape(stack: Stack) -> None:
    """402 ``billing_error`` and 429 ``rate_limit_error`` (with retry-after), as the official
    anthropic client reads them; counting tokens costs nothing, so a zero budget lets it by."""
    admin(stack, "POST", "/v1/admin/budgets", scope="tenant:claude", limit="0", period="day")
    admin(
        stack,
        "POST",
        "/v1/admin/limits",
        scope="tenant:claude_limited",
        requests_per_minute=1,
    )

    def claude(tenant: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=stack.url, api_key=stack.keys[tenant], max_retries=0)

    ask_claude = {"model": SIM_MODEL, "max_tokens": 8, "messages": ASK}
    with pytest.raises(anthropic.APIStatusError) as refused:
        claude("claude").messages.create(**ask_claude)
    assert refused.value.status_code == 402
    body = refused.value.response.json()
    assert (body["type"], body["error"]["type"]) == ("error", "billing_error")
    assert body["error"]["message"].endswith(f"limit 0; it resets {tomorrow()}")
    counted = claude("claude").messages.count_tokens(model=SIM_MODEL, messages=ASK)
    assert counted.input_tokens > 0
    if datetime.now(UTC).second > 50:  # both requests in one minute
        time.sleep(61 - datetime.now(UTC).second)
    claude("claude_limited").messages.create(**ask_claude)
    with pytest.raises(anthropic.RateLimitError) as limited:
        claude("claude_limited").messages.create(**ask_claude)
    reply = limited.value.response
    assert reply.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(reply.headers["retry-after"]) <= 60
    assert reply.headers["x-ratelimit-remaining-requests"] == "0"
    rows = stack.rows(RequestRow.tenant_id == stack.tenant_ids["claude"], count=1)
    assert [(r.status, r.endpoint) for r in rows] == [("refused", "/v1/messages")]


def test_a_budgeted_responses_call_is_capped_under_its_own_name(stack: Stack) -> None:
    """The Responses API's cap is ``max_output_tokens``: that is what a budgeted request
    without one is given (a ``max_tokens`` would mean nothing to the upstream)."""
    admin(stack, "POST", "/v1/admin/budgets", scope="tenant:capped", limit="1", period="day")
    for tenant, expected in (("capped", 5), ("free", 16)):
        reply = stack.client(tenant).responses.create(model=CAPPED, input="How much is left?")
        assert reply.usage.output_tokens == expected
        assert reply.status == "incomplete"  # both stopped at the cap they were given
        assert reply.incomplete_details.reason == "max_output_tokens"
