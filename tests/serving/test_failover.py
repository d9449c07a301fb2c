"""Failover, in-process: a replica that refuses connections, or drops them unanswered, is
tried no more and the request goes to the next as attempt 2 of the same interaction; an
answer, even a bad one, is never failed over; every attempt is on record, exactly.

Model ``m`` bills 3 / 0.30 / 15 USD per million: 1,000 prompt tokens (640 cached) and 20
output tokens cost 360 × 3 + 640 × 0.30 + 20 × 15 = 1,572 micro-dollars.
"""

from __future__ import annotations

import pytest

from tests.serving.conftest import CHAT, D, Harness, StartsWith, attempt, chat, facts
from tests.support.inprocess import refusing_url
from tests.support.upstream import Answer, Drop, Hang, completion, stream, vllm_usage

USAGE = vllm_usage(1000, 20, cached=640)
COST = D("0.001572000")
SERVED = (360, 640, 0, 20)


def unreachable(url: str) -> StartsWith:
    return StartsWith(f"upstream unreachable: {url}{CHAT}: ")


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_a_replica_refusing_connections_is_left_for_the_next_as_attempt_two(
    harness: Harness, streamed: bool
) -> None:
    answer = stream("Par", "is.", usage=USAGE) if streamed else Answer(completion(usage=USAGE))
    replica, up = await harness.scripted(answer)
    down = refusing_url()
    gateway = await harness.one(down, up)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(
            CHAT, json=chat(stream=streamed), headers={"x-interaction-id": "conv-7"}
        )
    assert reply.status_code == 200
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts("conv-7")] == [
        attempt(
            rid, down, status="failed", source="missing", error=unreachable(down), stream=streamed
        ),
        attempt(
            rid,
            up,
            number=2,
            tokens=SERVED,
            cost=COST,
            finish="stop",
            stream=streamed,
            first_token=streamed,
        ),
    ]
    [sent] = replica.bodies
    assert sent["model"] == "m" and len(sent["cache_salt"]) == 64
    if streamed:
        assert sent["stream_options"] == {"include_usage": True}
        assert b'"cost":"0.001572000"' in reply.content
    else:
        assert reply.json()["usage"]["cost"] == "0.001572000"


async def test_a_replica_dropping_the_connection_unanswered_is_left_for_the_next(
    harness: Harness,
) -> None:
    dropping, bad = await harness.scripted(Drop())
    _, good = await harness.scripted(Answer(completion(usage=USAGE)))
    gateway = await harness.one(bad, good)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
    rid = reply.headers["x-request-id"]
    assert reply.status_code == 200
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, bad, status="failed", source="missing", error=unreachable(bad)),
        attempt(rid, good, number=2, tokens=SERVED, cost=COST, finish="stop"),
    ]
    assert len(dropping.bodies) == 1


async def test_a_replica_left_once_is_not_tried_again(harness: Harness) -> None:
    """Out of rotation until a health check passes: the next request goes straight on."""
    _, up = await harness.scripted(Answer(completion(usage=USAGE)))
    down = refusing_url()
    gateway = await harness.one(down, up)
    async with gateway.http(harness.tenant.key) as http:
        await http.post(CHAT, json=chat())
        reply = await http.post(CHAT, json=chat())
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, up, tokens=SERVED, cost=COST, finish="stop")
    ]


async def test_with_no_replica_left_the_answer_is_a_503_and_every_attempt_is_on_record(
    harness: Harness,
) -> None:
    first, second = refusing_url(), refusing_url()
    gateway = await harness.one(first, second)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
        again = await http.post(CHAT, json=chat())
    rid, later = reply.headers["x-request-id"], again.headers["x-request-id"]
    assert (reply.status_code, reply.json()["error"]["code"]) == (503, "no_healthy_replica")
    assert reply.json()["error"]["message"] == unreachable(second)
    failed = {"status": "failed", "source": "missing"}
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, first, **failed, error=unreachable(first)),
        attempt(rid, second, number=2, **failed, error=unreachable(second)),
    ]
    # Both out of rotation: the next request is refused before any is tried, on record too.
    no_replica = "no healthy replica for model 'm'; retry shortly"
    assert (again.status_code, again.json()["error"]["message"]) == (503, no_replica)
    assert [facts(row) for row in await gateway.attempts(later)] == [
        attempt(later, "", **failed, error=no_replica)
    ]


@pytest.mark.parametrize(
    ("answer", "status", "message"),
    [
        (
            Answer(b"Internal Server Error", 500, "text/plain"),
            502,
            "upstream answered 500: b'Internal Server Error'",
        ),
        (
            Answer(
                {"error": {"message": "busy", "type": "ServiceUnavailableError", "code": 503}}, 503
            ),
            502,
            "upstream answered 503: 'busy'",
        ),
        (
            Answer(
                {
                    "error": {
                        "message": "too long",
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                },
                400,
            ),
            400,
            "too long",
        ),
    ],
    ids=["500-text", "503-json", "400-json"],
)
async def test_an_error_answer_is_the_requests_answer_not_a_reason_to_fail_over(
    harness: Harness, answer: Answer, status: int, message: str
) -> None:
    _, erring = await harness.scripted(answer)
    spare, good = await harness.scripted(Answer(completion(usage=USAGE)))
    gateway = await harness.one(erring, good)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
    rid = reply.headers["x-request-id"]
    assert (reply.status_code, reply.json()["error"]["message"]) == (status, message)
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, erring, status="failed", source="missing", error=message)
    ]
    assert spare.bodies == []


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_a_replica_silent_past_the_deployment_timeout_fails_the_request_unretried(
    harness: Harness, streamed: bool
) -> None:
    _, silent = await harness.scripted(Hang())
    spare, good = await harness.scripted(Answer(completion(usage=USAGE)))
    gateway = await harness.one(silent, good, timeout_s=0.3)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat(stream=streamed))
    rid = reply.headers["x-request-id"]
    message = f"upstream timed out: {silent}{CHAT}"
    assert (reply.status_code, reply.json()["error"]["message"]) == (502, message)
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, silent, status="failed", source="missing", error=message, stream=streamed)
    ]
    assert spare.bodies == []


async def test_a_failed_count_tokens_is_answered_in_anthropics_shape_and_not_recorded(
    harness: Harness,
) -> None:
    """Counting tokens is neither billed nor recorded: a failed attempt at it neither."""
    refused = {"error": {"message": "too long", "type": "BadRequestError", "code": 400}}
    _, erring = await harness.scripted(Answer(refused, 400))
    gateway = await harness.one(erring)
    counted = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post("/v1/messages/count_tokens", json=counted)
        unreached = await harness.one(refusing_url())
        async with unreached.http(harness.tenant.key) as other:
            down = await other.post("/v1/messages/count_tokens", json=counted)
    assert (reply.status_code, reply.json()) == (
        400,
        {"type": "error", "error": {"type": "invalid_request_error", "message": "too long"}},
    )
    assert await gateway.attempts(reply.headers["x-request-id"]) == []
    assert down.status_code == 503 and down.json()["type"] == "error"
    assert await unreached.attempts(down.headers["x-request-id"]) == []
