"""The KV event consumer against a simulated replica publishing vLLM's wire format.

Every test ends by comparing the consumer's exact index with the blocks the replica
really holds (its prefix cache, read in-process): after drops, a publisher restart, or
a publisher that went away and came back, the two are equal again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import openai
from aiohttp import web

from gateway.routing.exact import ExactIndex
from gateway.routing.kv_events import KvEventConsumer, KvEventSource
from gateway.routing.vllm_blocks import external
from gateway.tools.sim.events import KvEventsConfig
from gateway.tools.sim.server import REPLICA, SimConfig, create_app
from gateway.tools.sim.timing import TimingModel
from tests.support.kv_relay import LossyRelay

MODEL = "kvgate/demo-llama-8b"
REPLICA_NAME = "http://replica-a"


@dataclass
class LiveSim:
    app: web.Application
    api: openai.AsyncOpenAI
    events: KvEventsConfig

    def holdings(self) -> frozenset[int]:
        """What the replica's prefix cache holds, named as its KV events name blocks."""
        return frozenset(external(b) for b in self.app[REPLICA].engine.cache.blocks())  # type: ignore[arg-type]

    async def ask(self, text: str, *, salt: str | None = None) -> int:
        """One chat request; returns the cached tokens it reported."""
        extra = {"cache_salt": salt} if salt else None
        reply = await self.api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": text}],
            max_tokens=2,
            extra_body=extra,
        )
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        return reply.usage.prompt_tokens_details.cached_tokens or 0


def endpoints(tmp: Path) -> KvEventsConfig:
    return KvEventsConfig(f"ipc://{tmp}/kv-pub", f"ipc://{tmp}/kv-replay")


@asynccontextmanager
async def live_sim(events: KvEventsConfig, capacity_blocks: int = 24) -> AsyncIterator[LiveSim]:
    config = SimConfig(
        block_size=4, capacity_blocks=capacity_blocks, timing=TimingModel.zero(), kv_events=events
    )
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    api = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{runner.addresses[0][1]}/v1", api_key="unused", max_retries=0
    )
    try:
        yield LiveSim(app, api, events)
    finally:
        await api.close()
        await runner.cleanup()


@asynccontextmanager
async def consuming(
    source: KvEventSource, **kwargs: float
) -> AsyncIterator[tuple[KvEventConsumer, ExactIndex, list[bool]]]:
    index = ExactIndex()
    freshness: list[bool] = []
    consumer = KvEventConsumer(
        source,
        index,
        on_fresh=lambda _, f: freshness.append(f),
        probe_interval_s=kwargs.get("probe_interval_s", 0.1),
        replay_timeout_s=kwargs.get("replay_timeout_s", 0.3),
    )
    consumer.start()
    try:
        yield consumer, index, freshness
    finally:
        await consumer.stop()


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


def prompt(n: int, words: int = 12) -> str:
    return " ".join(f"{WORDS[(n + i) % len(WORDS)]}{n}" for i in range(words))


async def test_the_index_follows_the_replica_and_predicts_its_hits(tmp_path: Path) -> None:
    events = endpoints(tmp_path)
    async with live_sim(events) as sim:
        await sim.ask(prompt(0))  # before the consumer exists: learned by replay
        source = KvEventSource(REPLICA_NAME, events.endpoint, events.replay_endpoint)
        async with consuming(source) as (consumer, index, freshness):
            await until(lambda: consumer.fresh)
            for n in range(1, 4):
                await sim.ask(prompt(n))
            await until(lambda: index.blocks(REPLICA_NAME) == sim.holdings())
            assert freshness == [True]
            assert consumer.stats.gaps == consumer.stats.resyncs == consumer.stats.restarts == 0
            assert consumer.next_seq == sim.app[REPLICA].engine.events.publisher.published  # type: ignore[union-attr]
            # "<|user|>\n" + 12 words + "<|assistant|>\n": 14 tokens, 3 full blocks of 4;
            # vLLM recomputes the last token, so all 3 blocks (12 tokens) are reported.
            assert await sim.ask(prompt(2)) == 12


async def test_dropped_messages_are_replayed_when_the_next_one_shows_the_gap(
    tmp_path: Path,
) -> None:
    events = endpoints(tmp_path)
    async with (
        live_sim(events, capacity_blocks=16) as sim,
        LossyRelay(events.endpoint, f"ipc://{tmp_path}/relay") as relay,
    ):
        source = KvEventSource(REPLICA_NAME, relay.endpoint, events.replay_endpoint)
        # Probing is slowed down so that the gap is found by the next live message.
        async with consuming(source, probe_interval_s=30) as (consumer, index, _):
            await until(lambda: consumer.fresh)
            await sim.ask(prompt(0))
            await until(lambda: relay.forwarded == 1 and consumer.next_seq == 1)
            relay.dropping = True
            for n in range(1, 7):  # 7 x 3 blocks through 16: evictions among the drops
                await sim.ask(prompt(n))
            await until(lambda: relay.dropped == 6)
            relay.dropping = False
            await sim.ask(prompt(0))
            await until(lambda: index.blocks(REPLICA_NAME) == sim.holdings())
            assert relay.dropped == 6
            assert consumer.stats.gaps == 1 and consumer.stats.replayed >= 6
            assert consumer.stats.resyncs == consumer.stats.restarts == 0


async def test_a_silent_tail_of_drops_is_found_by_the_probe(tmp_path: Path) -> None:
    events = endpoints(tmp_path)
    async with (
        live_sim(events) as sim,
        LossyRelay(events.endpoint, f"ipc://{tmp_path}/relay") as relay,
    ):
        source = KvEventSource(REPLICA_NAME, relay.endpoint, events.replay_endpoint)
        async with consuming(source) as (consumer, index, _):
            await until(lambda: consumer.fresh)
            relay.dropping = True
            await sim.ask(prompt(1))
            await sim.ask(prompt(2))
            await until(lambda: index.blocks(REPLICA_NAME) == sim.holdings() != frozenset())
            assert relay.forwarded == 0 and consumer.stats.replayed >= 2


async def test_a_restarted_publisher_is_detected_and_its_empty_cache_taken(
    tmp_path: Path,
) -> None:
    events = endpoints(tmp_path)
    source = KvEventSource(REPLICA_NAME, events.endpoint, events.replay_endpoint)
    async with consuming(source) as (consumer, index, freshness):
        async with live_sim(events) as sim:
            for n in range(4):
                await sim.ask(prompt(n))
            await until(lambda: len(index.blocks(REPLICA_NAME)) == 12)
        # Gone: no answer on the replay socket, the view goes stale.
        await until(lambda: not consumer.fresh)
        async with live_sim(events) as sim:
            await sim.ask(prompt(9))
            await until(lambda: consumer.fresh and index.blocks(REPLICA_NAME) == sim.holdings())
            assert len(sim.holdings()) == 3
            assert consumer.stats.restarts == 1
            assert freshness == [True, False, True]


async def test_without_a_replay_socket_a_gap_resynchronises_and_never_over_claims(
    tmp_path: Path,
) -> None:
    events = endpoints(tmp_path)
    async with (
        live_sim(events, capacity_blocks=6) as sim,
        LossyRelay(events.endpoint, f"ipc://{tmp_path}/relay") as relay,
        consuming(KvEventSource(REPLICA_NAME, relay.endpoint)) as (consumer, index, _),
    ):
        await until(lambda: consumer.fresh)
        await sim.ask(prompt(0))
        await until(lambda: consumer.next_seq == 1)
        relay.dropping = True
        await sim.ask(prompt(1))  # evicts one of prompt 0's blocks: its removal is lost
        await until(lambda: relay.dropped == 1)
        relay.dropping = False
        await sim.ask(prompt(2))
        await until(lambda: consumer.stats.resyncs == 1)
        assert index.blocks(REPLICA_NAME) <= sim.holdings()
        assert consumer.stats.gaps == 1
