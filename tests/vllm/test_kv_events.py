"""KV events from the replicas, kept complete through dropped messages and a publisher
restart; afterwards the consumer's index equals the replica's holdings.

"Holdings" are checked two ways: against a reference consumer that saw every message
(directly, no relay), and against the replica's behaviour: a prompt the index says is
held for k blocks is served with exactly min(k, usable) blocks from cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import openai

from gateway.routing.exact import ExactIndex
from gateway.routing.kv_events import KvEventConsumer, KvEventSource
from tests.support.kv_relay import LossyRelay
from tests.support.processes import free_port
from tests.support.vllm import BLOCK_SIZE, SERVED_NAME
from tests.vllm.conftest import ExactStack, Replica
from tests.vllm.replicas import block_keys, gateway_metric, replica_tokens, settle, text

NAME = "replica"


@asynccontextmanager
async def consumer(endpoint: str, replay: str) -> AsyncIterator[tuple[KvEventConsumer, ExactIndex]]:
    index = ExactIndex()
    running = KvEventConsumer(
        KvEventSource(NAME, endpoint, replay, "kv"),
        index,
        probe_interval_s=0.2,
        replay_timeout_s=1.0,
    )
    running.start()
    try:
        yield running, index
    finally:
        await running.stop()


async def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def ask(replica: Replica, content: str) -> int:
    api = openai.AsyncOpenAI(base_url=replica.url + "/v1", api_key="unused", max_retries=0)
    try:
        reply = await api.chat.completions.create(
            model=SERVED_NAME,
            messages=[{"role": "user", "content": content}],
            max_tokens=2,
            temperature=0,
        )
    finally:
        await api.close()
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0


async def agrees_with_the_replica(replica: Replica, index: ExactIndex, prompts: list[str]) -> None:
    """Each prompt is served from cache for exactly the blocks the index says are held."""
    for content in prompts:
        tokens = replica_tokens(replica.url, [{"role": "user", "content": content}])
        held = index.match(NAME, block_keys(tokens))
        expected = min(held, (len(tokens) - 1) // BLOCK_SIZE) * BLOCK_SIZE
        assert await ask(replica, content) == expected
        await asyncio.sleep(0.3)  # the repeat's own events, before the next check


async def test_dropped_messages_are_recovered_and_the_index_equals_the_holdings(
    stack: ExactStack,
) -> None:
    replica = stack.backend.replicas[1]
    relay_endpoint = f"tcp://127.0.0.1:{free_port()}"
    async with (
        LossyRelay(replica.events_endpoint, relay_endpoint) as relay,
        consumer(replica.events_endpoint, replica.replay_endpoint) as (reference, truth),
        consumer(relay_endpoint, replica.replay_endpoint) as (lossy, index),
    ):
        await until(lambda: reference.fresh and lossy.fresh)
        prompts = [text(500 + n, 330) for n in range(8)]
        await ask(replica, prompts[0])
        await until(lambda: relay.forwarded > 0)
        relay.dropping = True
        for content in prompts[1:7]:  # 6 long prompts through 48 blocks: evictions too
            await ask(replica, content)
        # Every batch published so far has passed the relay (and was dropped) first.
        await asyncio.sleep(0.3)
        await until(
            lambda: reference.next_seq is not None and relay.last_seq == reference.next_seq - 1
        )
        relay.dropping = False
        await ask(replica, prompts[7])
        await until(lambda: index.blocks(NAME) == truth.blocks(NAME))
        # Recovered by replay: found by the next message (a gap) or by the idle probe.
        assert relay.dropped > 0 and lossy.stats.replayed > 0
        assert lossy.stats.resyncs == lossy.stats.restarts == 0
        await agrees_with_the_replica(replica, index, [prompts[0], prompts[5], prompts[7]])


async def test_a_restarted_replica_is_detected_and_its_new_empty_cache_followed(
    stack: ExactStack,
) -> None:
    replica = stack.backend.replicas[1]
    gateway = stack.client()
    through_gateway = "Restart check: " + text(601, 200)
    async with consumer(replica.events_endpoint, replica.replay_endpoint) as (watcher, index):
        await until(lambda: watcher.fresh)
        freshness: list[bool] = []
        before = [text(610 + n, 200) for n in range(2)]
        for content in before:
            await ask(replica, content)
        for _ in range(2):
            gateway.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": through_gateway}],
                max_tokens=2,
                temperature=0,
            )
        await until(lambda: len(index.blocks(NAME)) > 0)
        watch = asyncio.ensure_future(_record_freshness(watcher, freshness))
        await asyncio.to_thread(replica.restart)
        after = text(620, 200)
        await ask(replica, after)
        await until(lambda: watcher.stats.restarts == 1 and watcher.fresh)
        async with consumer(replica.events_endpoint, replica.replay_endpoint) as (_, truth):
            await until(lambda: index.blocks(NAME) == truth.blocks(NAME) != frozenset())
        watch.cancel()
        assert False in freshness
        await agrees_with_the_replica(replica, index, [*before, after])

    # The gateway's own view followed the restart too: in sync again, predictions exact.
    await until(lambda: _gateway_fresh(stack, replica.url) == 1.0)
    replicas = [(r.url, r.replay_endpoint) for r in stack.backend.replicas]
    for _ in range(2):
        await asyncio.to_thread(settle, stack.gateway.url, "tiny", replicas)
        raw = gateway.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": through_gateway}],
            max_tokens=2,
            temperature=0,
        )
        reply = raw.parse()
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        row = stack.row(raw.headers["x-request-id"])
        assert row.predicted_cached_tokens == reply.usage.prompt_tokens_details.cached_tokens


def _gateway_fresh(stack: ExactStack, replica_url: str) -> float | None:
    return gateway_metric(stack.gateway.url, "kvgate_replica_kv_events_fresh", "tiny", replica_url)


async def _record_freshness(watcher: KvEventConsumer, seen: list[bool]) -> None:
    while True:
        if not seen or seen[-1] != watcher.fresh:
            seen.append(watcher.fresh)
        await asyncio.sleep(0.02)
