"""The simulator's own application behind an in-process gateway: prefix-cache hits billed
to the nano-dollar and predicted to the token (the deployment hashes prompts with the
sim's tokenizer), and a replica that stops serving mid-test failed over from, without a
process to kill. Model ``m`` bills 3 / 0.30 / 15 USD per million tokens.

The system prompt and the question render to 209 tokens (13 full blocks of 16, and one
token); "And of Spain?" to 206, the first 202 shared (12 full blocks).
"""

from __future__ import annotations

from typing import Any

from tests.factories import vllm
from tests.serving.conftest import CHAT, D, Harness, StartsWith, attempt, facts
from tests.support.inprocess import Gateway

SYSTEM = "You are the kvgate test assistant. Answer briefly and precisely. " * 20
FRANCE = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is the capital of France?"},
]
SPAIN = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "And of Spain?"}]


def kv_aware(*replicas: str) -> dict[str, Any]:
    return vllm("m", replicas, tokenizer="kvgate-sim", connect_timeout_s=2)


async def ask(gateway: Gateway, key: str, messages: list[dict[str, str]]) -> str:
    async with gateway.http(key) as http:
        reply = await http.post(CHAT, json={"model": "m", "messages": messages, "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    return str(reply.headers["x-request-id"])


async def test_a_repeated_prompt_is_read_from_the_cache_billed_so_and_was_predicted(
    harness: Harness,
) -> None:
    """Every full block but the one holding the prompt's last token is a hit: 208 of 209."""
    url = await harness.sim()
    gateway = await harness.gateway(kv_aware(url))
    client = gateway.client(harness.tenant.key)
    first = await client.chat.completions.with_raw_response.create(
        model="m", messages=FRANCE, max_tokens=4
    )  # type: ignore[arg-type]
    again = await client.chat.completions.create(model="m", messages=FRANCE, max_tokens=4)  # type: ignore[arg-type]
    await client.close()
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert (again.usage.prompt_tokens, again.usage.prompt_tokens_details.cached_tokens) == (
        209,
        208,
    )
    # 1 × 3 + 208 × 0.30 + 4 × 15 per million
    assert (again.usage.model_extra or {})["cost"] == "0.000125400"
    rows = await gateway.attempts()
    rid = first.headers["x-request-id"]
    assert [facts(row) for row in rows] == [
        # 209 × 3 + 4 × 15
        attempt(rid, url, tokens=(209, 0, 0, 4), cost=D("0.000687000"), finish="length"),
        attempt(
            rows[1].request_id, url, tokens=(1, 208, 0, 4), cost=D("0.000125400"), finish="length"
        ),
    ]
    assert [(r.predicted_cached_tokens, r.ceiling_cached_tokens) for r in rows] == [
        (0, 0),
        (208, 208),
    ]


async def test_a_replica_that_stops_serving_is_failed_over_and_its_cache_forgotten(
    harness: Harness,
) -> None:
    """The replica holding the prefix goes away: the next request for it is attempt 2 on the
    other, which has nothing cached and was predicted to have nothing; once there, the
    prefix is routed to its new home and hits."""
    urls = [await harness.sim(), await harness.sim()]
    gateway = await harness.gateway(kv_aware(*urls))
    key = harness.tenant.key
    await ask(gateway, key, FRANCE)
    [first] = await gateway.attempts()
    holder = first.upstream
    [other] = [u for u in urls if u != holder]
    await harness.stop(holder)

    moved = await ask(gateway, key, SPAIN)
    rows = await gateway.attempts(moved)
    assert [facts(row) for row in rows] == [
        attempt(
            moved,
            holder,
            status="failed",
            source="missing",
            error=StartsWith(f"upstream unreachable: {holder}{CHAT}: "),
        ),
        # 206 × 3 + 4 × 15
        attempt(
            moved, other, number=2, tokens=(206, 0, 0, 4), cost=D("0.000678000"), finish="length"
        ),
    ]
    # A failed attempt reports nothing to predict against; on B the router expected nothing.
    assert [r.predicted_cached_tokens for r in rows] == [None, 0]

    back = await ask(gateway, key, FRANCE)
    [row] = await gateway.attempts(back)
    # 202 shared tokens came with Spain: 12 full blocks; 17 × 3 + 192 × 0.30 + 4 × 15
    assert facts(row) == attempt(
        back, other, tokens=(17, 192, 0, 4), cost=D("0.000168600"), finish="length"
    )
    assert row.predicted_cached_tokens == 192
