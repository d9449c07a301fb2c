"""Structured output and tools pass through the vLLM path untouched, in-process: what the
replica is sent carries the client's JSON schema, tools, tool choice and instructions as
the client wrote them, and the replica's JSON answer reaches the client as it was, billed.
Model ``m`` bills 3 / 0.30 / 15 USD per million."""

from __future__ import annotations

from typing import Any

import orjson

from tests.serving.conftest import CHAT, D, Harness, attempt, facts
from tests.support.upstream import Answer, completion, vllm_usage

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
ANSWER = '{"city":"Paris","population":2102650}'
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look a city up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    "strict": True,
}
RESPONSE = {
    "id": "resp_scripted",
    "object": "response",
    "created_at": 1_767_225_600,
    "model": "m",
    "status": "completed",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
        }
    ],
    "usage": {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 64},
        "output_tokens": 14,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 134,
    },
}
COST = D("0.000397200")  # 56 × 3 + 64 × 0.30 + 14 × 15 per million: 168 + 19.2 + 210


async def test_a_responses_json_schema_and_tools_reach_the_replica_as_written(
    harness: Harness,
) -> None:
    replica, url = await harness.scripted(Answer(RESPONSE))
    gateway = await harness.one(url)
    asked: dict[str, Any] = {
        "model": "m",
        "instructions": "Answer in JSON.",
        "input": "Which city is the capital of France, and how many live there?",
        "text": {
            "format": {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}
        },
        "tools": [TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
    }
    async with gateway.client(harness.tenant.key) as client:
        raw = await client.responses.with_raw_response.create(**asked)
    response = raw.parse()
    assert response.output_text == ANSWER and orjson.loads(response.output_text)["city"] == "Paris"
    [sent] = replica.bodies
    for member in ("instructions", "input", "text", "tools", "tool_choice", "parallel_tool_calls"):
        assert sent[member] == asked[member], member
    rid = raw.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, tokens=(56, 64, 0, 14), cost=COST, finish="completed")
    ]


async def test_a_chat_response_format_and_tool_choice_reach_the_replica_as_written(
    harness: Harness,
) -> None:
    replica, url = await harness.scripted(
        Answer(completion(ANSWER, usage=vllm_usage(120, 14, cached=64)))
    )
    gateway = await harness.one(url)
    asked: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "The capital of France, as JSON."}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
        },
        "tools": [{"type": "function", "function": {k: TOOL[k] for k in ("name", "parameters")}}],
        "tool_choice": "none",
    }
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=asked)
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == ANSWER
    [sent] = replica.bodies
    for member in ("messages", "response_format", "tools", "tool_choice"):
        assert sent[member] == asked[member], member
    rid = reply.headers["x-request-id"]
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(rid, url, tokens=(56, 64, 0, 14), cost=COST, finish="stop")
    ]
