"""What an upstream may say that a database column cannot hold, and a client that leaves a
whole answer: the edges where the request path once fell short (each was a strict xfail
here until fixed). Found with the in-process harness.

A record the database refuses is set aside by the writer (RELIABILITY.md), but the client
was answered and billed for a request that no statement would show: every value an
upstream sends is recorded on both databases, as exactly as a column can hold it.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.factories import litellm
from tests.serving.conftest import CHAT, D, Harness, attempt, chat, facts, hang_up_once_sent
from tests.support.upstream import Answer, Hang, completion, vllm_usage

# MESSAGES' prompt as the gateway estimates it: a token per four characters.
ESTIMATED_PROMPT = 7


async def test_a_count_past_32_bits_is_recorded(harness: Harness) -> None:
    """A replica that reports 3,000,000,000 prompt tokens is billed for them: the record
    says so in the database, as the client's answer did (Postgres: bigint columns, 0018)."""
    _, url = await harness.scripted(Answer(completion(usage=vllm_usage(3_000_000_000, 20))))
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
    # 3e9 × 3 + 20 × 15 per million
    assert reply.json()["usage"]["cost"] == "9000.000300000"
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, tokens=(3_000_000_000, 0, 0, 20), cost=D("9000.000300000"), finish="stop")
    ]


@pytest.mark.parametrize(
    ("said", "recorded"),
    [
        ("st\x00op", "st\ufffdop"),  # Postgres refuses a NUL in text: U+FFFD in its place
        ("x" * 51, "x" * 49 + "\u2026"),  # the column holds 50 characters
        ("length", "length"),
    ],
)
async def test_a_finish_reason_no_column_holds_is_recorded_as_near_as_it_can(
    harness: Harness, said: str, recorded: str
) -> None:
    """The answer passes the upstream's finish reason on as it was; the record keeps it
    without NUL and within its column, the same on both databases, at the same cost."""
    body = completion(finish=said, usage=vllm_usage(10, 2))
    _, url = await harness.scripted(Answer(body))
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
    assert reply.json()["choices"][0]["finish_reason"] == said
    rid = reply.headers["x-request-id"]
    [row] = await gateway.attempts(rid)
    assert (row.status, row.finish_reason, row.cost_total) == (
        "completed",
        recorded,
        D("0.000060000"),  # 10 × 3 + 2 × 15 per million
    )


async def test_a_client_leaving_a_whole_answer_cancels_the_replicas_work(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that hangs up while a replica works on its whole (non-streamed) answer:
    the replica's request is cancelled at once (not left to run until it answers or the
    deployment's timeout), the attempt is recorded cancelled with its prompt estimated, as
    a stream cut before its first token is, not retried, and nothing is logged as an error."""
    replica, url = await harness.scripted(Hang())
    gateway = await harness.one(url, timeout_s=30)
    await hang_up_once_sent(gateway, harness.tenant.key, replica, chat())
    await replica.until(lambda r: r.cancelled == 1, timeout_s=1.0)
    [row] = await gateway.attempts(count=1)
    assert facts(row) == attempt(
        row.request_id,
        url,
        status="cancelled",
        tokens=(ESTIMATED_PROMPT, 0, 0, 0),
        source="estimated",
        cost=D(ESTIMATED_PROMPT * 3) / 1_000_000,
        error="client disconnected",
    )
    assert len(replica.bodies) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_client_leaving_a_hosted_whole_answer_leaves_the_provider_to_answer(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hosted provider bills what it generates whether anyone reads it or not, so its call
    is not cancelled when the client goes: it runs to its own end (here the deployment's
    1 s timeout), and the record says how it ended there, not ``cancelled``."""
    monkeypatch.setenv("KVGATE_TEST_PROVIDER_KEY", "sk-test")
    replica, url = await harness.scripted(Hang())
    gateway = await harness.gateway(
        litellm(
            "m",
            "openai/m",
            api_base=url + "/v1",
            api_key_env="KVGATE_TEST_PROVIDER_KEY",
            price_model="m",
            timeout_s=1,
        )
    )
    await hang_up_once_sent(gateway, harness.tenant.key, replica, chat())
    await asyncio.sleep(0.5)
    assert replica.cancelled == 0  # still asked, half a second after the client left
    [row] = await gateway.attempts(count=1, timeout_s=5)
    assert (row.status, row.usage_source) == ("failed", "missing")
    assert row.error is not None and "timed out" in row.error
    await replica.until(lambda r: r.cancelled == 1, timeout_s=2.0)  # closed at the timeout
