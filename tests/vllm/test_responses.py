"""/v1/responses in exact mode, against `kvgate sim` and real vLLM (marker ``vllm``): the
gateway hashes the prompt the replica renders (instructions + input items as chat
messages), so what it predicted is what the replica served from cache; what it recorded
is what the replica reported, streamed and not, its cost is the demo price's, and the
tenant's statement has the same figures on a /v1/responses line."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import openai

from gateway.db.session import session_factory, transaction
from tests.factories import demo_cost, tenant
from tests.support.statements import Seen
from tests.vllm.conftest import ExactStack
from tests.vllm.replicas import text


def test_responses_are_routed_on_the_prompt_the_replica_renders(stack: ExactStack) -> None:
    with transaction(session_factory(stack.engine)) as session:
        key = tenant(session, f"responses-{stack.backend.kind}").key
    client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key=key, max_retries=0)
    instructions = text(7201, 160)
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": text(7202, 20)}]},
        {"role": "user", "content": "and the next question: " + text(7204, 10)},
    ]
    asked: dict[str, Any] = {
        "model": "tiny-solo",
        "instructions": instructions,
        "input": items,
        "max_output_tokens": 3,
        "temperature": 0,
    }
    seen: list[tuple[int, int, int | None]] = []  # (reported cached, recorded, predicted)
    billed = Seen()
    for stream in (False, True, False):
        if stream:
            raw = client.responses.with_raw_response.create(stream=True, **asked)
            events = list(raw.parse())
            assert events[0].type == "response.created"
            assert events[-1].type == "response.completed"
            usage = events[-1].response.usage  # type: ignore[union-attr]
        else:
            raw = client.responses.with_raw_response.create(**asked)
            usage = raw.parse().usage
        assert usage is not None
        row = stack.row(raw.headers["x-request-id"])
        assert row.status == "completed" and row.endpoint == "/v1/responses"
        assert row.uncached_tokens + row.cache_read_tokens == usage.input_tokens
        assert row.output_tokens == usage.output_tokens
        cached = usage.input_tokens_details.cached_tokens
        # The demo price's, to the nano-dollar, in the response and on the record.
        cost = demo_cost(usage.input_tokens, cached, usage.output_tokens)
        assert usage.model_extra is not None and Decimal(usage.model_extra["cost"]) == cost
        assert Decimal(row.cost_total) == cost and usage.output_tokens == 3
        seen.append((cached, row.cache_read_tokens, row.predicted_cached_tokens))
        billed.add(
            "/v1/responses",
            uncached=usage.input_tokens - cached,
            cached=cached,
            output=usage.output_tokens,
            cost=usage.model_extra["cost"],
        )
    assert [recorded for _, recorded, _ in seen] == [reported for reported, _, _ in seen]
    # Repeats were served from cache, and the router knew exactly how much.
    assert seen[1][0] > 0 and seen[2][0] > 0
    assert [predicted for _, _, predicted in seen[1:]] == [reported for reported, _, _ in seen[1:]]
    # The tenant is the test's own: nothing was cached before its first request.
    assert seen[0][0] == 0
    billed.check(stack.statement(key))
