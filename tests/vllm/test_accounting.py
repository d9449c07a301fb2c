"""What kvgate records equals what the replica did, to the token: per request (chat,
streamed chat, completions) against the replica's own usage, and in sum against the
replica's ``vllm:prefix_cache_hits_total``."""

from __future__ import annotations

import time

from tests.vllm.conftest import ExactStack
from tests.vllm.replicas import prefix_cache_hits, text


def test_recorded_cached_tokens_equal_reported_ones_and_sum_to_the_hit_counter(
    stack: ExactStack,
) -> None:
    urls = [r.url for r in stack.backend.replicas]
    before = prefix_cache_hits(urls)
    client = stack.client()
    system = {"role": "system", "content": text(101, 200)}
    recorded: list[int] = []
    reported: list[int] = []
    for turn in range(3):
        messages = [system, {"role": "user", "content": f"question {turn}: " + text(turn, 30)}]
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=3, temperature=0
        )  # type: ignore[list-item]
        reply = raw.parse()
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        reported.append(reply.usage.prompt_tokens_details.cached_tokens or 0)
        recorded.append(_cache_read(stack, raw.headers["x-request-id"], reply.usage.prompt_tokens))

        streamed = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=messages,
            max_tokens=3,
            temperature=0,
            stream=True,  # type: ignore[list-item]
            stream_options={"include_usage": True},
        )
        chunks = list(streamed.parse())
        usage = chunks[-1].usage
        assert usage is not None and usage.prompt_tokens_details is not None
        reported.append(usage.prompt_tokens_details.cached_tokens or 0)
        recorded.append(_cache_read(stack, streamed.headers["x-request-id"], usage.prompt_tokens))

    completion = client.completions.with_raw_response.create(
        model="tiny", prompt=text(102, 150), max_tokens=2, temperature=0
    )
    again = client.completions.with_raw_response.create(
        model="tiny", prompt=text(102, 150), max_tokens=2, temperature=0
    )
    for raw_completion in (completion, again):
        parsed = raw_completion.parse()
        assert parsed.usage is not None and parsed.usage.prompt_tokens_details is not None
        reported.append(parsed.usage.prompt_tokens_details.cached_tokens or 0)
        recorded.append(
            _cache_read(stack, raw_completion.headers["x-request-id"], parsed.usage.prompt_tokens)
        )

    assert recorded == reported
    # The shared system prompt and the repeats were served from cache: the test means something.
    assert sum(1 for tokens in recorded if tokens) >= 6
    _eventually_equal(lambda: prefix_cache_hits(urls) - before, sum(recorded))


def _cache_read(stack: ExactStack, request_id: str, prompt_tokens: int) -> int:
    row = stack.row(request_id)
    assert row.status == "completed"
    assert row.cache_read_tokens + row.uncached_tokens == prompt_tokens
    return row.cache_read_tokens


def _eventually_equal(read: object, expected: int, timeout_s: float = 3.0) -> None:
    # The replica updates its counters from its engine loop, a moment after answering.
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()  # type: ignore[operator]
        if value == expected or time.monotonic() > deadline:
            assert value == expected
            return
        time.sleep(0.1)
