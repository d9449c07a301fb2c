"""/v1/messages (Anthropic's wire, served by the replica itself) in exact mode, against
`kvgate sim` and real vLLM (marker ``vllm``), with the official ``anthropic`` client: what
the gateway predicted is what the replica served from cache, what it recorded is what the
replica reported (Anthropic's convention: ``input_tokens`` leaves out the cache reads),
the cost is the demo price's to the nano-dollar, streamed and not, and the tenant's
statement has the same figures on a line of each endpoint."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import anthropic

from tests.factories import demo_cost
from tests.support.processes import cli_tenant
from tests.vllm.conftest import ExactStack
from tests.vllm.replicas import replica_tokens, text


def usage_cost(usage: Any) -> Decimal:
    """The ``cost`` the gateway adds to the SDK's usage model (kept as an extra)."""
    return Decimal((usage.model_extra or {})["cost"])


def test_messages_are_routed_recorded_and_priced_as_the_replica_reports(
    stack: ExactStack,
) -> None:
    key, _ = cli_tenant(stack.env, f"messages-{stack.backend.kind}")
    claude = anthropic.Anthropic(base_url=stack.gateway.url, api_key=key, max_retries=0)
    system = [{"type": "text", "text": text(7301, 160), "cache_control": {"type": "ephemeral"}}]
    question = [{"role": "user", "content": "and the next question: " + text(7302, 12)}]
    asked: dict[str, Any] = {
        "model": "tiny-solo",
        "system": system,
        "messages": question,
        "max_tokens": 3,
    }
    # The prompt the replica renders, as its own tokenizer counts it.
    rendered = replica_tokens(
        stack.backend.replicas[0].url,
        [{"role": "system", "content": system[0]["text"]}, *question],
    )
    seen: list[tuple[int, int, int | None]] = []  # (reported cached, recorded, predicted)
    totals = {"uncached": 0, "cached": 0, "output": 0, "cost": Decimal(0)}
    for stream in (False, True, False):
        if stream:
            raw = claude.messages.with_raw_response.create(stream=True, **asked)
            events = list(raw.parse())
            assert events[0].type == "message_start" and events[-1].type == "message_stop"
            usage = events[-2].usage  # message_delta: the final usage, billed
        else:
            raw = claude.messages.with_raw_response.create(**asked)
            usage = raw.parse().usage
        cached = usage.cache_read_input_tokens or 0
        prompt = usage.input_tokens + cached
        assert prompt == len(rendered)
        assert usage.output_tokens == 3
        assert usage_cost(usage) == demo_cost(prompt, cached, 3)
        row = stack.row(raw.headers["x-request-id"])
        assert row.status == "completed" and row.endpoint == "/v1/messages"
        assert (row.uncached_tokens, row.cache_read_tokens, row.output_tokens) == (
            usage.input_tokens,
            cached,
            3,
        )
        assert Decimal(row.cost_total) == demo_cost(prompt, cached, 3)
        seen.append((cached, row.cache_read_tokens, row.predicted_cached_tokens))
        totals["uncached"] += usage.input_tokens
        totals["cached"] += cached
        totals["output"] += 3
        totals["cost"] += usage_cost(usage)
    # Repeats were served from cache, and the router knew exactly how much.
    assert seen[1][0] > 0 and seen[2][0] > 0
    assert [predicted for _, _, predicted in seen[1:]] == [reported for reported, _, _ in seen[1:]]

    counted = claude.messages.count_tokens(model="tiny-solo", system=system, messages=question)  # type: ignore[arg-type]
    assert counted.input_tokens == len(rendered)

    (line,) = stack.statement(key)["line_items"]
    assert line["endpoint"] == "/v1/messages" and line["requests"] == 3
    assert [line["uncached_tokens"], line["cache_read_tokens"], line["output_tokens"]] == [
        totals["uncached"],
        totals["cached"],
        totals["output"],
    ]
    assert Decimal(line["cost_total"]) == totals["cost"]
