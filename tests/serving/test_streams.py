"""Streams, in-process: events pass through as the replica sent them, the usage chunk
comes back priced, and a stream that breaks, hangs, lacks [DONE] or usage, or whose
client leaves, is recorded exactly as what it was. Model ``m`` bills 3 / 0.30 / 15 USD
per million; the prompt is 30 characters, so an estimate counts 7 prompt tokens.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.serving.conftest import (
    CHAT,
    D,
    Harness,
    StartsWith,
    attempt,
    chat,
    facts,
    hang_up_once_sent,
)
from tests.support.upstream import (
    DONE,
    Answer,
    Stream,
    completion,
    event,
    role,
    token,
    usage_chunk,
    vllm_usage,
)

USAGE = vllm_usage(1000, 3, cached=640)
SERVED = (360, 640, 0, 3)
COST = D("0.001317000")  # 360 × 3 + 640 × 0.30 + 3 × 15 per million
WORDS = [role(), token("Pa"), token("ri"), token("s.", "stop")]
STREAM = {"stream": True, "first_token": True}


def error_event(message: str) -> bytes:
    body = {"message": message, "type": "upstream_error", "param": None, "code": None}
    return b"data: " + orjson.dumps({"error": body}) + b"\n\n"


def cut_after_one_token(rid: str, url: str, status: str, error: Any) -> dict[str, Any]:
    """The record of a stream that ended after its first token: 7 estimated prompt tokens
    and 1 output token, 7 × 3 + 1 × 15 per million."""
    return attempt(
        rid,
        url,
        status=status,
        tokens=(7, 0, 0, 1),
        source="estimated",
        cost=D("0.000036000"),
        error=error,
        **STREAM,
    )


def events(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


def priced(chunk: bytes) -> dict[str, Any]:
    """The usage of the gateway's closing usage chunk."""
    data = orjson.loads(chunk.removeprefix(b"data: "))
    assert data["choices"] == []
    return dict(data["usage"])


def billed(usage: dict[str, Any], cost: str, source: str = "reported") -> dict[str, Any]:
    """The replica's usage as the gateway returns it: its billed classes, cost and source."""
    details = {**usage.get("prompt_tokens_details", {}), "cache_write_tokens": 0}
    return {**usage, "prompt_tokens_details": details, "cost": cost, "usage_source": source}


async def test_a_stream_reaches_the_official_client_with_its_usage_priced(
    harness: Harness,
) -> None:
    replica, url = await harness.scripted(Stream([*WORDS, usage_chunk(USAGE), DONE]))
    gateway = await harness.one(url)
    client = gateway.client(harness.tenant.key)
    response = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=chat()["messages"],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in response.parse()]
    await client.close()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Paris."
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (1000, 3)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 640
    assert (usage.model_extra or {})["cost"] == "0.001317000"
    rid = response.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, tokens=SERVED, cost=COST, finish="stop", **STREAM)
    ]
    assert replica.bodies[0]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("shape", ["whole-events", "7-byte-pieces", "crlf", "keep-alive-comments"])
async def test_events_pass_through_as_sent_however_they_are_cut(
    harness: Harness, shape: str
) -> None:
    """The client gets the replica's events unchanged but for the usage chunk (priced) and
    line endings (LF); the bill is the same whatever the cutting."""
    sent = [*WORDS, usage_chunk(USAGE), DONE]
    if shape == "keep-alive-comments":
        sent = [b": keep-alive\n\n", *sent[:2], b": keep-alive\n\n", *sent[2:]]
    raw = b"".join(sent)
    if shape == "crlf":
        raw = raw.replace(b"\n", b"\r\n")
    pieces = [raw[i : i + 7] for i in range(0, len(raw), 7)] if shape == "7-byte-pieces" else [raw]
    _, url = await harness.scripted(Stream(pieces, pause_s=0.001))
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat(stream=True))
    got = events(reply.content)
    assert got[:-2] == [e for e in sent if e not in (usage_chunk(USAGE), DONE)]
    assert priced(got[-2]) == billed(USAGE, "0.001317000")
    assert got[-1] == DONE
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, tokens=SERVED, cost=COST, finish="stop", **STREAM)
    ]


async def test_a_client_that_did_not_ask_for_usage_gets_none_but_it_is_billed(
    harness: Harness,
) -> None:
    """The gateway always asks the replica for usage; the client sees only what it asked."""
    replica, url = await harness.scripted(Stream([*WORDS, usage_chunk(USAGE), DONE]))
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat(stream=True, usage=False))
    assert reply.content == b"".join(WORDS) + DONE
    assert replica.bodies[0]["stream_options"] == {"include_usage": True}
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, tokens=SERVED, cost=COST, finish="stop", **STREAM)
    ]


async def test_events_after_done_are_not_passed_on(harness: Harness) -> None:
    _, url = await harness.scripted(Stream([*WORDS, usage_chunk(USAGE), DONE, token("late")]))
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat(stream=True, usage=False))
    assert reply.content == b"".join(WORDS) + DONE


async def test_a_stream_ending_without_done_fails_and_is_billed_for_the_usage_it_reported(
    harness: Harness,
) -> None:
    """The tokens were generated and reported: billed, on a failed attempt; the client is
    told with an error event, and gets neither the usage chunk nor [DONE]."""
    _, url = await harness.scripted(Stream([*WORDS, usage_chunk(USAGE)]))
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat(stream=True))
    message = "upstream stream ended before [DONE]"
    assert reply.content == b"".join(WORDS) + error_event(message)
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(
            rid,
            url,
            status="failed",
            tokens=SERVED,
            cost=COST,
            finish="stop",
            error=message,
            **STREAM,
        )
    ]


async def test_a_replica_dying_mid_stream_fails_it_on_an_estimate_and_is_not_retried(
    harness: Harness,
) -> None:
    """Bytes have reached the client: no second attempt. Output so far: one content event."""
    _, url = await harness.scripted(Stream(WORDS[:2], end="drop"))
    spare, other = await harness.scripted(Answer(completion()))
    gateway = await harness.one(url, other)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat(stream=True))
    broke = StartsWith(f"upstream stream broke: {url}{CHAT}: ")
    got = events(reply.content)
    assert got[:2] == WORDS[:2] and len(got) == 3
    assert orjson.loads(got[2].removeprefix(b"data: "))["error"]["message"] == broke
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        cut_after_one_token(rid, url, "failed", broke)
    ]
    assert spare.bodies == []


async def test_a_replica_silent_mid_stream_past_the_timeout_fails_it(harness: Harness) -> None:
    _, url = await harness.scripted(Stream(WORDS[:2], end="hang"))
    gateway = await harness.one(url, timeout_s=0.3)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat(stream=True))
    message = f"upstream stream timed out: {url}{CHAT}"
    assert reply.content == b"".join(WORDS[:2]) + error_event(message)
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        cut_after_one_token(rid, url, "failed", message)
    ]


@pytest.mark.parametrize(
    ("closing", "tokens", "source", "cost", "to_client"),
    [
        # No usage chunk: 7 estimated prompt tokens, 3 content events: 21 + 45.
        (None, (7, 0, 0, 3), "estimated", D("0.000066000"), None),
        # Not JSON: passed on as it came; an estimate.
        (
            event('{"choices":[],"usage":{"prompt_tokens":'),
            (7, 0, 0, 3),
            "estimated",
            D("0.000066000"),
            "as-sent",
        ),
        # Usage that is not an object: passed on, and (not a usage chunk) counted as output.
        (usage_chunk("lots"), (7, 0, 0, 4), "estimated", D("0.000081000"), "as-sent"),
        # An object of wrong types: the replica's usage, read as zeros, priced at nothing.
        (
            usage_chunk({"prompt_tokens": "9", "completion_tokens": [1]}),
            (0, 0, 0, 0),
            "reported",
            D("0E-9"),
            "priced",
        ),
    ],
    ids=["no-usage-chunk", "not-json", "usage-not-an-object", "usage-of-wrong-types"],
)
async def test_a_usage_chunk_missing_or_spoilt_is_passed_on_and_billed_for_what_can_be_read(
    harness: Harness,
    closing: bytes | None,
    tokens: tuple[int, ...],
    source: str,
    cost: D,
    to_client: str | None,
) -> None:
    sent = [*WORDS, *([closing] if closing else []), DONE]
    _, url = await harness.scripted(Stream(sent))
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat(stream=True))
    got = events(reply.content)
    assert got[:4] == WORDS and got[-1] == DONE
    # The client asked for usage: the last chunk before [DONE] is always the gateway's,
    # billed for what was read (an estimate, said so, when the replica's was unreadable).
    if to_client is None:
        assert len(got) == 6
    elif to_client == "as-sent":
        assert got[4:-2] == [closing]
    closing_usage = priced(got[-2])
    assert (closing_usage["cost"], closing_usage["usage_source"]) == (f"{cost:f}", source)
    assert closing_usage["prompt_tokens"] == sum(tokens[:3])
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, tokens=tokens, source=source, cost=cost, finish="stop", **STREAM)
    ]


async def test_a_client_leaving_mid_stream_cancels_the_replicas_work_and_is_recorded(
    harness: Harness,
) -> None:
    replica, url = await harness.scripted(Stream(WORDS[:2], end="hang"))
    gateway = await harness.one(url)
    async with (
        gateway.http(harness.tenant.key) as http,
        http.stream("POST", CHAT, json=chat(stream=True)) as reply,
    ):
        rid = reply.headers["x-request-id"]
        seen = b""
        async for data in reply.aiter_bytes():
            seen += data
            if b'"Pa"' in seen:
                break  # the client hangs up with the first token in hand
    [row] = await gateway.attempts(rid, count=1)
    assert facts(row) == cut_after_one_token(rid, url, "cancelled", "client disconnected")
    await replica.until(lambda r: r.cancelled == 1)


async def test_a_client_leaving_before_the_first_token_is_recorded_with_no_output(
    harness: Harness,
) -> None:
    replica, url = await harness.scripted(Stream([], end="hang"))
    gateway = await harness.one(url)
    await hang_up_once_sent(gateway, harness.tenant.key, replica, chat(stream=True))
    rows = await gateway.attempts(count=1)  # the client never saw the request's id
    await replica.until(lambda r: r.cancelled == 1)
    assert [facts(row) for row in rows] == [
        attempt(
            rows[0].request_id,
            url,
            status="cancelled",
            tokens=(7, 0, 0, 0),
            source="estimated",
            cost=D("0.000021000"),
            error="client disconnected",
            stream=True,
        )
    ]
