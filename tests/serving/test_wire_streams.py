"""Responses and Messages streams that break, in-process: a replica dying mid-stream fails
the attempt on an estimate, is not retried (bytes have reached the client) and ends the
client's stream with the wire's own error event; a client leaving mid-stream cancels the
replica's work and is recorded. Model ``m`` bills 3 / 0.30 / 15 USD per million; the
prompt is 30 characters, so an estimate counts 7 prompt tokens."""

from __future__ import annotations

from typing import Any

import orjson

from tests.serving.conftest import MESSAGES, D, Harness, StartsWith, attempt, facts
from tests.support.upstream import Answer, Stream, completion

RESPONSES = "/v1/responses"
ANTHROPIC = "/v1/messages"
STREAM = {"stream": True, "first_token": True}


def sse(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"


RESPONSE = {"id": "resp_scripted", "object": "response", "model": "m", "status": "in_progress"}
RESPONSES_OPENING = [
    sse("response.created", {"response": RESPONSE}),
    sse("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "delta": "Pa"}),
]
MESSAGE = {
    "id": "msg_scripted",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [],
    "usage": {"input_tokens": 25, "output_tokens": 1},
}
MESSAGES_OPENING = [
    sse("message_start", {"message": MESSAGE}),
    sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Pa"}}),
]


def responses_body() -> dict[str, Any]:
    return {"model": "m", "input": MESSAGES[0]["content"], "stream": True}


def messages_body() -> dict[str, Any]:
    return {"model": "m", "max_tokens": 5, "messages": MESSAGES, "stream": True}


def split(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


def error_data(event: bytes) -> dict[str, Any]:
    name, _, data = event.partition(b"\ndata: ")
    assert name == b"event: error"
    return dict(orjson.loads(data))


# A Responses stream cut after its first delta: nothing reported yet, so the prompt is
# estimated (30 characters: 7 tokens) and the output is the one delta seen: 7 × 3 + 15.
RESPONSES_CUT = {"tokens": (7, 0, 0, 1), "source": "estimated", "cost": D("0.000036000")}
# A Messages stream cut after its first delta: the input as message_start reported it
# (25), the output the larger of its count and the deltas seen (1): 25 × 3 + 15.
MESSAGES_CUT = {"tokens": (25, 0, 0, 1), "source": "estimated", "cost": D("0.000090000")}


async def die_after_opening(
    harness: Harness, opening: list[bytes], path: str, body: dict[str, Any]
) -> tuple[list[bytes], str, list[dict[str, Any]], Any]:
    """A replica that dies once it sent ``opening``, a spare one beside it: the events the
    client got, the dead replica's URL, the request's attempts, and the spare."""
    _, url = await harness.scripted(Stream(opening, end="drop"))
    spare, other = await harness.scripted(Answer(completion()))
    gateway = await harness.one(url, other)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(path, json=body)
    rows = await gateway.attempts(reply.headers["x-request-id"])
    return split(reply.content), url, [facts(row) for row in rows], spare


async def test_a_replica_dying_mid_responses_stream_fails_it_on_an_estimate(
    harness: Harness,
) -> None:
    got, url, attempts, spare = await die_after_opening(
        harness, RESPONSES_OPENING, RESPONSES, responses_body()
    )
    assert len(got) == 3 and got[1] == RESPONSES_OPENING[1]
    # The response's id, marked with the replica that holds it (stored-response routing).
    created = orjson.loads(got[0].partition(b"\ndata: ")[2])
    assert created["response"]["id"].startswith("resp_scripted_")
    broke = StartsWith(f"upstream stream broke: {url}{RESPONSES}: ")
    assert error_data(got[2]) == {
        "type": "error", "code": None, "message": broke, "param": None
    }  # fmt: skip
    rid = attempts[0]["request_id"]
    assert attempts == [attempt(rid, url, status="failed", error=broke, **RESPONSES_CUT, **STREAM)]
    assert spare.bodies == []  # bytes had reached the client: no second attempt


async def test_a_replica_dying_mid_messages_stream_fails_it_on_what_was_reported(
    harness: Harness,
) -> None:
    got, url, attempts, spare = await die_after_opening(
        harness, MESSAGES_OPENING, ANTHROPIC, messages_body()
    )
    assert got[:3] == MESSAGES_OPENING and len(got) == 4
    broke = StartsWith(f"upstream stream broke: {url}{ANTHROPIC}: ")
    assert error_data(got[3]) == {"type": "error", "error": {"type": "api_error", "message": broke}}
    rid = attempts[0]["request_id"]
    assert attempts == [attempt(rid, url, status="failed", error=broke, **MESSAGES_CUT, **STREAM)]
    assert spare.bodies == []


async def leave_after_first_delta(
    harness: Harness, opening: list[bytes], path: str, body: dict[str, Any]
) -> tuple[str, str, Any]:
    """A client that hangs up with the first delta in hand; (request id, url, replica)."""
    replica, url = await harness.scripted(Stream(opening, end="hang"))
    gateway = await harness.one(url)
    async with (
        gateway.http(harness.tenant.key) as http,
        http.stream("POST", path, json=body) as reply,
    ):
        rid = reply.headers["x-request-id"]
        seen = b""
        async for data in reply.aiter_bytes():
            seen += data
            if b'"Pa"' in seen:
                break
    [row] = await gateway.attempts(rid, count=1)
    await replica.until(lambda r: r.cancelled == 1)
    return rid, url, facts(row)


async def test_a_client_leaving_mid_responses_stream_cancels_it_and_is_recorded(
    harness: Harness,
) -> None:
    rid, url, row = await leave_after_first_delta(
        harness, RESPONSES_OPENING, RESPONSES, responses_body()
    )
    assert row == attempt(
        rid, url, status="cancelled", error="client disconnected", **RESPONSES_CUT, **STREAM
    )


async def test_a_client_leaving_mid_messages_stream_cancels_it_and_is_recorded(
    harness: Harness,
) -> None:
    rid, url, row = await leave_after_first_delta(
        harness, MESSAGES_OPENING, ANTHROPIC, messages_body()
    )
    assert row == attempt(
        rid, url, status="cancelled", error="client disconnected", **MESSAGES_CUT, **STREAM
    )
