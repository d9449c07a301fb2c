"""Exact mode: for every request of a scripted sequence (shared prefixes, partial
overlaps, repeats, and enough new prompts to make the replicas evict), the router's
prediction of the cached tokens equals the count the replica reported.

The router predicts from the replicas' KV events; before each request the test waits
until the gateway has applied every batch the replicas published (a prediction made
before the previous request's events landed would be a race, not a model error).
"""

from __future__ import annotations

from tests.support.vllm import BLOCK_SIZE
from tests.vllm.conftest import ExactStack
from tests.vllm.replicas import settle, text


def test_predictions_equal_the_replicas_counts_through_sharing_and_eviction(
    stack: ExactStack,
) -> None:
    client = stack.client()
    shared = text(201, 260)  # about 8 blocks, shared by several requests
    first, second = "First question: " + text(1, 40), "Second question: " + text(2, 40)
    # (label, deployment, system prompt, question): "tiny" has both replicas; "tiny-solo"
    # only the first, so that the fillers certainly go where the shared prompt is.
    script: list[tuple[str, str, str, str]] = [
        ("first sight", "tiny", shared, first),
        ("shared system prompt", "tiny", shared, second),
        ("repeat", "tiny", shared, first),
        ("partial overlap", "tiny", shared[: len(shared) // 2], "Half of it."),
        ("on the first replica", "tiny-solo", shared, first),
    ]
    # Twelve new long prompts (about 12 blocks each) through its 48 blocks: evictions.
    script += [(f"filler {n}", "tiny-solo", text(300 + n, 380), "Go on.") for n in range(12)]
    script += [
        ("after eviction", "tiny-solo", shared, first),
        ("after eviction, again", "tiny-solo", shared, first),
    ]

    replicas = {"tiny": [(r.url, r.replay_endpoint) for r in stack.backend.replicas]}
    replicas["tiny-solo"] = replicas["tiny"][:1]
    outcomes: list[tuple[str, int, int, int]] = []
    for label, model, system, question in script:
        settle(stack.gateway.url, model, replicas[model])
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=2, temperature=0
        )  # type: ignore[arg-type]
        reply = raw.parse()
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        row = stack.row(raw.headers["x-request-id"])
        reported = reply.usage.prompt_tokens_details.cached_tokens or 0
        outcomes.append((label, row.predicted_cached_tokens, reported, reply.usage.prompt_tokens))

    assert [(label, predicted) for label, predicted, _, _ in outcomes] == [
        (label, reported) for label, _, reported, _ in outcomes
    ]
    by_label = {label: (reported, prompt) for label, _, reported, prompt in outcomes}
    usable = (by_label["repeat"][1] - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert by_label["first sight"][0] == 0
    assert 0 < by_label["shared system prompt"][0] < usable  # the system prompt's blocks
    assert by_label["repeat"][0] == usable  # every full block but the last token's
    assert 0 < by_label["partial overlap"][0] < by_label["shared system prompt"][0]
    # The fillers pushed the shared prompt out: it comes back with fewer hits, then all.
    assert by_label["after eviction"][0] < usable
    assert by_label["after eviction, again"][0] == usable
