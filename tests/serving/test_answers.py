"""Whole (non-streaming) answers a replica gets wrong, in-process: what the client is told
and what is recorded, exactly. An answer that is not a JSON object is the upstream's
failure (502, recorded failed); an object with bad usage is served, and its counts are
read as the wire rules say: absent or malformed counts are zero, cached tokens never more
than the prompt. Model ``m`` bills 3 / 0.30 / 15 USD per million tokens.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.serving.conftest import CHAT, ZERO, D, Harness, attempt, chat, facts
from tests.support.upstream import Answer, completion, vllm_usage

VLLM_ERROR = {"type": "BadRequestError", "param": None, "code": 400}


def without_usage() -> dict[str, Any]:
    body = completion()
    del body["usage"]
    return body


@pytest.mark.parametrize(
    ("answer", "status", "error"),
    [
        (
            Answer(b"<html>oops</html>", content_type="text/html"),
            502,
            {
                "message": "upstream answered 200: b'<html>oops</html>'",
                "type": "upstream_error",
                "param": None,
                "code": None,
            },
        ),
        (
            Answer([1, 2, 3]),
            502,
            {
                "message": "upstream answered 200: b'[1,2,3]'",
                "type": "upstream_error",
                "param": None,
                "code": None,
            },
        ),
        (
            Answer(b'{"id": "cut-short", "choi', content_type="application/json"),
            502,
            {
                "message": 'upstream answered 200: b\'{"id": "cut-short", "choi\'',
                "type": "upstream_error",
                "param": None,
                "code": None,
            },
        ),
        (
            Answer(
                {"error": {**VLLM_ERROR, "message": "max_tokens too large", "param": "max_tokens"}},
                400,
            ),
            400,
            {
                "message": "max_tokens too large",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": None,
            },
        ),
        (
            Answer({"error": {**VLLM_ERROR, "message": "slow down", "code": 429}}, 429),
            429,
            {
                "message": "slow down",
                "type": "rate_limit_error",
                "param": None,
                "code": None,
            },
        ),
        (
            Answer(b"slow down", 429, "text/plain"),
            502,
            {
                "message": "upstream answered 429: b'slow down'",
                "type": "upstream_error",
                "param": None,
                "code": None,
            },
        ),
    ],
    ids=["html", "json-array", "truncated-json", "400-vllm-error", "429-json", "429-text"],
)
async def test_an_answer_that_is_not_a_json_object_or_an_error_is_recorded_failed(
    harness: Harness, answer: Answer, status: int, error: dict[str, Any]
) -> None:
    """A 4xx in JSON is the client's, said in our error shape with its status; anything
    else is the upstream's failure, a 502. Either way: one failed attempt, nothing billed."""
    _, url = await harness.scripted(answer)
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
    rid = reply.headers["x-request-id"]
    assert (reply.status_code, reply.json()) == (status, {"error": error})
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, status="failed", source="missing", error=error["message"])
    ]


@pytest.mark.parametrize(
    ("body", "tokens", "source", "cost"),
    [
        (without_usage(), (0, 0, 0, 0), "missing", ZERO),
        (completion(usage=None), (0, 0, 0, 0), "missing", ZERO),
        (completion(usage={}), (0, 0, 0, 0), "missing", ZERO),
        (completion(usage=[1000, 20]), (0, 0, 0, 0), "missing", ZERO),
        (completion(usage="1000 tokens"), (0, 0, 0, 0), "missing", ZERO),
        # "1000" is a string, not a count; 20.7 is read as 20; true is not a count.
        (
            completion(
                usage={
                    "prompt_tokens": "1000",
                    "completion_tokens": 20.7,
                    "prompt_tokens_details": {"cached_tokens": True},
                }
            ),
            (0, 0, 0, 20),
            "reported",
            D("0.000300000"),
        ),
        # 999 cached of a 100-token prompt: all 100 cached, 100 × 0.30 + 5 × 15.
        (
            completion(usage=vllm_usage(100, 5, cached=999)),
            (0, 100, 0, 5),
            "reported",
            D("0.000105000"),
        ),
        (
            completion(usage={"prompt_tokens": -5, "completion_tokens": 3}),
            (0, 0, 0, 3),
            "reported",
            D("0.000045000"),
        ),
        (
            completion(usage={"prompt_tokens": 1e400, "completion_tokens": 2}),
            (0, 0, 0, 2),
            "reported",
            D("0.000030000"),
        ),
        (
            completion(usage={**vllm_usage(1000, 20), "prompt_tokens_details": [640]}),
            (1000, 0, 0, 20),
            "reported",
            D("0.003300000"),
        ),
    ],
    ids=[
        "absent",
        "null",
        "empty",
        "a-list",
        "a-string",
        "wrong-types",
        "cached-past-prompt",
        "negative",
        "infinite",
        "details-a-list",
    ],
)
async def test_an_answer_with_bad_usage_is_served_and_billed_for_what_it_says(
    harness: Harness, body: dict[str, Any], tokens: tuple[int, ...], source: str, cost: D
) -> None:
    _, url = await harness.scripted(Answer(body))
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
    rid = reply.headers["x-request-id"]
    assert reply.status_code == 200
    served = reply.json()
    assert served["choices"] == body["choices"]
    # The client's usage is the upstream's with the cost added (one usage shape for every
    # backend is issue 15's): the bill is the record.
    assert served["usage"]["cost"] == f"{cost:f}"
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, tokens=tokens, source=source, cost=cost, finish="stop")
    ]


@pytest.mark.parametrize(
    ("choices", "finish"),
    [
        ("nope", None),
        ([], None),
        (["a string choice"], None),
        ([{"index": 0, "text": "x"}], None),
        ([{"index": 0, "finish_reason": None}], None),
        (
            [{"index": 0, "finish_reason": "length"}, {"index": 1, "finish_reason": "stop"}],
            "length",
        ),
        ([{"index": 0, "finish_reason": 7}], "7"),
    ],
    ids=[
        "a-string",
        "empty",
        "not-objects",
        "no-finish",
        "null-finish",
        "first-of-two",
        "a-number",
    ],
)
async def test_the_finish_reason_is_the_first_choices_whatever_the_choices_are(
    harness: Harness, choices: Any, finish: str | None
) -> None:
    body = {**completion(usage=vllm_usage(10, 2)), "choices": choices}
    _, url = await harness.scripted(Answer(body))
    gateway = await harness.one(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
    rid = reply.headers["x-request-id"]
    assert (reply.status_code, reply.json()["choices"]) == (200, choices)
    # 10 × 3 + 2 × 15 per million
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, tokens=(10, 0, 0, 2), cost=D("0.000060000"), finish=finish)
    ]
