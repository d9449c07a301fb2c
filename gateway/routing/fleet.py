"""The replicas of one deployment: health, load readings, KV events, and the placement
of each request (`gateway.routing.placement`, the code replay runs too).

    prompt input ─▶ hasher: block hashes (once) ─▶ ceiling.observe ─▶ Route
    place ─▶ Placer: views, policy.choose, in flight, queued prefill, index.record
    first token ─▶ queued prefill becomes a running sequence
    usage ─▶ learn: index.correct (a replica that reports less than predicted has evicted)
    KV events ─▶ exact holdings, used for replicas whose event stream is in sync; a
                 stored block confirms a prediction, and counts as seen for the ceiling
                 (so that instances behind one balancer share the ceiling's view)
    /metrics ─▶ the replica's own running and waiting counts, block size, hash algorithm

Everything here runs on the event loop and is O(replicas + prompt blocks) per request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import aiohttp

from gateway.routing.ceiling import HitCeiling
from gateway.routing.exact import RoutingIndex
from gateway.routing.fleet_config import FleetConfig
from gateway.routing.index import ApproximateIndex
from gateway.routing.inputs import PromptInput, PromptTokenizer
from gateway.routing.load import read_load
from gateway.routing.peers import CORRECTED, PLACED, PeerLink
from gateway.routing.placement import (
    Placement,
    Placer,
    Replica,
    Route,
    make_route,
    tokens_for_blocks,
)
from gateway.routing.predicted import PredictedIndex
from gateway.routing.prompts import SIM_TOKENIZER, Prompt, PromptHasher

if TYPE_CHECKING:
    from gateway.routing.kv_events import KvEventConsumer

log = logging.getLogger("kvgate.fleet")
# Prompts longer than this (about 2,000 tokens) are tokenized and hashed off the loop.
OFF_LOOP_PROMPT_CHARS = 8_000


class Fleet:
    """The replicas behind one model name."""

    def __init__(
        self,
        config: FleetConfig,
        *,
        tokenizer: PromptTokenizer | None = None,
        ceiling: HitCeiling | None = None,
    ) -> None:
        if (config.tokenizer is None) != (tokenizer is None):
            raise ValueError(
                f"model {config.name!r}: tokenizer {config.tokenizer!r} configured, "
                f"{'none' if tokenizer is None else 'one'} given"
            )
        self.config = config
        self.name = config.name
        self.replicas = [Replica(url, capacity=config.max_num_seqs) for url in config.replicas]
        self._urls = frozenset(config.replicas)
        self.hasher = PromptHasher(
            model=config.served_name,
            block_size=config.block_size,
            tokenizer=tokenizer,
            hash_seed=config.hash_seed,
            # A model directory's replicas say how they size and hash blocks (read_loads);
            # the simulator's are the deployment's.
            configured=config.tokenizer in (None, SIM_TOKENIZER),
        )
        self.index = RoutingIndex(
            ApproximateIndex(config.capacity_blocks, lower=config.lower_blocks),
            predicted=PredictedIndex(config.prediction_ttl_s),
        )
        self.placer = Placer(
            self.replicas,
            self.index,
            policy=config.policy,
            tunables=config.tunables,
            tier_weights=config.tier_weights,
            name=config.name,
        )
        self.ceiling = ceiling or HitCeiling()
        self.consumers: list[KvEventConsumer] = []  # made by event_consumers()
        # The other workers of this gateway, told of every change to the index (peers.py).
        self.peers: PeerLink | None = None

    # -- a request's life --------------------------------------------------------------

    def route(
        self, source: PromptInput, *, cache_salt: str, request_id: str, interaction_id: str
    ) -> Route:
        """The request's blocks under the tenant's salt, and its keys, for every attempt."""
        prompt = self.hasher.prompt(source, cache_salt)
        return self._route(prompt, request_id=request_id, interaction_id=interaction_id)

    async def route_async(
        self, source: PromptInput, *, cache_salt: str, request_id: str, interaction_id: str
    ) -> Route:
        """``route``, with a long prompt's tokenizing and hashing in a worker thread.

        With a model's tokenizer that is milliseconds for a long prompt (a template render,
        the tokenizer, a sha256 per block), which on the event loop would stall every other
        request meanwhile. Short prompts, and text mode (about 0.3 ms for 32,000 tokens),
        stay on the loop, where a thread hop would cost more than the work.
        """
        if self.hasher.exact and source.chars > OFF_LOOP_PROMPT_CHARS:
            prompt = await asyncio.to_thread(self.hasher.prompt, source, cache_salt)
        else:
            prompt = self.hasher.prompt(source, cache_salt)
        return self._route(prompt, request_id=request_id, interaction_id=interaction_id)

    def _route(self, prompt: Prompt, *, request_id: str, interaction_id: str) -> Route:
        # The salt is in every hash's root, so one scope per deployment keeps tenants apart.
        return make_route(
            prompt,
            request_id=request_id,
            interaction_id=interaction_id,
            ceiling_blocks=self.ceiling.observe(self.name, prompt.hashes),
        )

    def place(self, route: Route, *, exclude: frozenset[str] = frozenset()) -> Placement:
        """Choose a replica for one attempt and count it as in flight there; raises
        `NoReplicaAvailable` when every replica is down or excluded."""
        placement = self.placer.place(route, now=time.monotonic(), exclude=exclude)
        if self.peers is not None and route.prompt.hashes:
            self.peers.placed(self.name, placement.replica.name, route.prompt.hashes)
        return placement

    def first_token(self, placement: Placement) -> None:
        """The attempt streamed its first token."""
        self.placer.first_token(placement)

    def finish(self, placement: Placement) -> None:
        """The attempt ended."""
        self.placer.finish(placement)

    def learn(
        self, route: Route, placement: Placement, *, cached_tokens: int, prompt_tokens: int
    ) -> None:
        """Fold a replica's reported cached tokens back into the index."""
        learned = self.placer.learn(
            route, placement, cached_tokens=cached_tokens, prompt_tokens=prompt_tokens
        )
        if self.peers is not None and learned.reported_blocks != learned.predicted_blocks:
            self.peers.corrected(
                self.name,
                learned.replica,
                route.prompt.hashes,
                learned.reported_blocks,
                learned.predicted_blocks,
            )

    def apply_peer(
        self, kind: int, replica: str, hashes: Sequence[int], reported: int, predicted: int
    ) -> None:
        """Another worker's change to its index, made to this one the same way."""
        if replica not in self._urls or not hashes:
            return  # a worker with another configuration: not this fleet's replica
        if kind == PLACED:
            self.ceiling.observe(self.name, hashes)
            self.index.record(replica, hashes, now=time.monotonic())
        elif kind == CORRECTED:
            self.index.correct(replica, hashes, reported, predicted_blocks=predicted)

    def predicted_tokens(self, route: Route, placement: Placement, prompt_tokens: int) -> int:
        """Cached tokens the router predicted for the attempt, as the replica counts them."""
        return tokens_for_blocks(route.prompt, placement.predicted_blocks, prompt_tokens)

    def ceiling_tokens(self, route: Route, prompt_tokens: int) -> int:
        """Cached tokens a perfect router with an infinite cache would have got."""
        return tokens_for_blocks(route.prompt, route.ceiling_blocks, prompt_tokens)

    # -- what the replicas say about themselves -----------------------------------------

    def event_consumers(self) -> list[KvEventConsumer]:
        """One KV event consumer per replica that publishes, feeding the exact index."""
        if not self.config.kv_events:
            return []
        # ZeroMQ (60 ms to import) only for deployments that publish KV events.
        from gateway.routing.kv_events import KvEventConsumer

        sink = _EventSink(self.index, self.ceiling, self.name)
        self.consumers = [
            KvEventConsumer(source, sink, on_fresh=self.index.set_fresh)
            for source in self.config.kv_events
        ]
        return self.consumers

    async def read_loads(self, session: aiohttp.ClientSession) -> None:
        """Read every replica's /metrics: its load, and how it names blocks."""
        model = self.config.served_name
        loads = await asyncio.gather(
            *(read_load(session, r.url, model=model) for r in self.replicas)
        )
        for replica, load in zip(self.replicas, loads, strict=True):
            replica.read(load)
            if load is not None and load.cache is not None:
                self.hasher.configure(load.cache)

    # -- health ------------------------------------------------------------------------

    def has_alternative(self, tried: set[str]) -> bool:
        """Whether an available replica remains that this request has not tried."""
        now = time.monotonic()
        return any(r.url not in tried and r.available(now) for r in self.replicas)

    def mark_down(self, replica: Replica) -> None:
        """Out of rotation until a health check passes (a cool-down alone would send requests
        to a dead replica again each time it ran out)."""
        if replica.available(time.monotonic()):
            log.warning("replica %s of %s taken out", replica.url, self.name)
        replica.failures += 1
        replica.down_until = math.inf
        # A replica that went away may come back empty: its blocks are not to be trusted.
        self.index.forget(replica.url)

    def mark_up(self, replica: Replica) -> None:
        """Put the replica back in rotation, its failures forgotten."""
        if replica.down_until:
            log.info("replica %s of %s back in rotation", replica.url, self.name)
        replica.failures = 0
        replica.down_until = 0.0

    async def check_health(self, session: aiohttp.ClientSession, timeout_s: float = 2.0) -> None:
        """Poll every replica's /health; take out the failing, bring back the recovered."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)

        async def check(replica: Replica) -> None:
            try:
                async with session.get(replica.url + "/health", timeout=timeout) as reply:
                    healthy = reply.status == 200
            except (aiohttp.ClientError, TimeoutError):
                healthy = False
            if healthy:
                self.mark_up(replica)
            else:
                self.mark_down(replica)

        await asyncio.gather(*(check(r) for r in self.replicas))


class _EventSink:
    """A replica's KV events: into the routing index; stored blocks seen by the ceiling."""

    def __init__(self, index: RoutingIndex, ceiling: HitCeiling, scope: str) -> None:
        self.index = index
        self.ceiling = ceiling
        self.scope = scope

    def block_stored(
        self, replica: str, hashes: Sequence[int], *, medium: str | None = None
    ) -> None:
        self.index.block_stored(replica, hashes, medium=medium)
        self.ceiling.seen(self.scope, hashes)

    def block_removed(
        self, replica: str, hashes: Sequence[int], *, medium: str | None = None
    ) -> None:
        self.index.block_removed(replica, hashes, medium=medium)

    def all_blocks_cleared(self, replica: str) -> None:
        self.index.all_blocks_cleared(replica)
