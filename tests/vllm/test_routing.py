"""Exact mode: for every request of a scripted sequence (shared prefixes, partial
overlaps, repeats, and enough new prompts to make the replicas evict), the router's
prediction of the cached tokens equals the count the replica reported.

The router predicts from the replicas' KV events; between requests the test leaves the
events a moment to arrive, as a real fleet's requests leave them (a prediction made
before the events of the previous request landed would be a race, not a model error).
"""

from __future__ import annotations

import time

from tests.support.vllm import BLOCK_SIZE
from tests.vllm.conftest import ExactStack
from tests.vllm.replicas import text

SETTLE_S = 0.3


def test_predictions_equal_the_replicas_counts_through_sharing_and_eviction(
    stack: ExactStack,
) -> None:
    client = stack.client()
    shared = text(201, 260)  # about 8 blocks, shared by several requests
    first, second = "First question: " + text(1, 40), "Second question: " + text(2, 40)
    script: list[tuple[str, str, str]] = [
        ("first sight", shared, first),
        ("shared system prompt", shared, second),
        ("repeat", shared, first),
        ("partial overlap", shared[: len(shared) // 2], "Half of it."),
    ]
    # Twelve new long prompts (about 12 blocks each) through 2 x 48 blocks: evictions.
    script += [(f"filler {n}", text(300 + n, 380), "Go on.") for n in range(12)]
    script += [("after eviction", shared, first), ("after eviction, again", shared, first)]

    outcomes: list[tuple[str, int, int, int]] = []
    for label, system, question in script:
        time.sleep(SETTLE_S)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=2, temperature=0)  # type: ignore[arg-type]
        reply = raw.parse()
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        row = stack.row(raw.headers["x-request-id"])
        reported = reply.usage.prompt_tokens_details.cached_tokens or 0
        outcomes.append((label, row.predicted_cached_tokens, reported, reply.usage.prompt_tokens))

    assert [(label, predicted) for label, predicted, _, _ in outcomes] == [
        (label, reported) for label, _, reported, _ in outcomes]
    by_label = {label: (reported, prompt) for label, _, reported, prompt in outcomes}
    usable = (by_label["repeat"][1] - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert by_label["first sight"][0] == 0
    assert 0 < by_label["shared system prompt"][0] < usable  # the system prompt's blocks
    assert by_label["repeat"][0] == usable  # every full block but the last token's
    assert 0 < by_label["partial overlap"][0] < by_label["shared system prompt"][0]
    # The fillers pushed the shared prompt out: it comes back with fewer hits, then all.
    assert by_label["after eviction"][0] < usable
    assert by_label["after eviction, again"][0] == usable
