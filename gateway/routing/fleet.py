"""The replicas of one deployment: load, health, and where each request goes.

    prompt hashes (once) ─▶ ceiling.observe ─▶ index.match_all ─▶ ReplicaView per healthy
    replica ─▶ policy.choose ─▶ Placement (in-flight, queued prefill) ─▶ index.record
    first token ─▶ queued prefill becomes a running sequence
    usage ─▶ index.correct (a replica that reports less than predicted has evicted)
    KV events ─▶ exact holdings, used for replicas whose event stream is in sync
    /metrics ─▶ the replica's own running and waiting counts, block size, hash algorithm

Everything here runs on the event loop and is O(replicas + prompt blocks) per request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import xxhash

from gateway.api.calls import Call
from gateway.config import Deployment
from gateway.errors import UpstreamUnavailable
from gateway.routing.ceiling import HitCeiling
from gateway.routing.exact import RoutingIndex
from gateway.routing.index import ApproximateIndex
from gateway.routing.load import ReplicaLoad, read_load
from gateway.routing.peers import CORRECTED, PLACED, PeerLink
from gateway.routing.policy import ReplicaView, RouteRequest, Tunables, choose
from gateway.routing.prompts import Prompt, PromptHasher

if TYPE_CHECKING:
    from gateway.routing.kv_events import KvEventConsumer

log = logging.getLogger("kvgate.fleet")
# Prompts longer than this (about 2,000 tokens) are tokenized and hashed off the loop.
OFF_LOOP_PROMPT_CHARS = 8_000


@dataclass(slots=True)
class Replica:
    url: str
    in_flight: int = 0
    queued_prefill_tokens: int = 0  # predicted uncached tokens of requests before first token
    running: int = 0  # requests past their first token
    down_until: float = 0.0
    failures: int = 0
    load: ReplicaLoad | None = None  # the replica's own last reading of its /metrics

    def available(self, now: float) -> bool:
        return self.down_until <= now


@dataclass(frozen=True, slots=True)
class Route:
    """The routing facts of one request, computed once for all its attempts."""

    prompt: Prompt
    ceiling_blocks: int
    key: int
    interaction: int


@dataclass(slots=True)
class Placement:
    """One attempt's place on a replica, and what the router expected there."""

    replica: Replica
    predicted_blocks: int
    queued_tokens: int
    started: bool = False
    finished: bool = False


def _view(replica: Replica, matched_blocks: int) -> ReplicaView:
    """The policy's view of a replica: this gateway's counts, or the replica's own when
    they are higher (other gateways' requests are there too)."""
    running, in_flight = replica.running, replica.in_flight
    load = replica.load
    if load is not None:
        running = max(running, load.running)
        in_flight = max(in_flight, load.running + load.waiting)
    return ReplicaView(
        name=replica.url,
        matched_blocks=matched_blocks,
        in_flight=in_flight,
        queued_prefill_tokens=replica.queued_prefill_tokens,
        running=running,
    )


def _key(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode())


class Fleet:
    """The replicas behind one model name."""

    def __init__(self, deployment: Deployment, *, ceiling: HitCeiling | None = None) -> None:
        self.deployment = deployment
        self.replicas = [Replica(url) for url in deployment.replica_urls]
        self._urls = frozenset(deployment.replica_urls)
        self.policy = deployment.policy
        self.tunables = Tunables(**deployment.tunables)  # type: ignore[arg-type]  # validated in config
        self.hasher = PromptHasher(
            model=deployment.served_name,
            block_size=deployment.block_size,
            tokenizer=deployment.tokenizer,
            hash_seed=deployment.hash_seed,
        )
        self.index = RoutingIndex(ApproximateIndex(deployment.capacity_blocks))
        self.ceiling = ceiling or HitCeiling()
        self.consumers: list[KvEventConsumer] = []  # made by event_consumers()
        # The other workers of this gateway, told of every change to the index (peers.py).
        self.peers: PeerLink | None = None
        self._sequence = itertools.count()

    # -- a request's life --------------------------------------------------------------

    def route(self, call: Call, *, cache_salt: str, request_id: str, interaction_id: str) -> Route:
        prompt = self.hasher.prompt(call, cache_salt)
        return self._route(prompt, request_id=request_id, interaction_id=interaction_id)

    async def route_async(
        self, call: Call, *, cache_salt: str, request_id: str, interaction_id: str
    ) -> Route:
        """``route``, with a long prompt's tokenizing and hashing in a worker thread.

        With a model's tokenizer that is milliseconds for a long prompt (a template render,
        the tokenizer, a sha256 per block), which on the event loop would stall every other
        request meanwhile. Short prompts, and text mode (about 0.3 ms for 32,000 tokens),
        stay on the loop, where a thread hop would cost more than the work.
        """
        if self.hasher.exact and call.prompt_chars > OFF_LOOP_PROMPT_CHARS:
            prompt = await asyncio.to_thread(self.hasher.prompt, call, cache_salt)
        else:
            prompt = self.hasher.prompt(call, cache_salt)
        return self._route(prompt, request_id=request_id, interaction_id=interaction_id)

    def _route(self, prompt: Prompt, *, request_id: str, interaction_id: str) -> Route:
        # The salt is in every hash's root, so one scope per deployment keeps tenants apart.
        return Route(
            prompt=prompt,
            ceiling_blocks=self.ceiling.observe(self.deployment.name, prompt.hashes),
            key=_key(request_id),
            interaction=_key(interaction_id),
        )

    def place(self, route: Route, *, exclude: frozenset[str] = frozenset()) -> Placement:
        """Choose a replica for one attempt and count it as in flight there."""
        now = time.monotonic()
        candidates = [r for r in self.replicas if r.url not in exclude and r.available(now)]
        if not candidates:
            raise UpstreamUnavailable(
                f"no healthy replica for model {self.deployment.name!r}; retry shortly"
            )
        prompt = route.prompt
        matched = self.index.match_all(prompt.hashes) if prompt.hashes else {}
        views = [_view(r, matched.get(r.url, 0)) for r in candidates]
        request = RouteRequest(
            seq=next(self._sequence),
            key=route.key,
            interaction=route.interaction,
            prompt_tokens=prompt.prompt_tokens,
            block_tokens=prompt.block_tokens,
        )
        chosen = candidates[choose(self.policy, request, views, self.tunables)]
        predicted = matched.get(chosen.url, 0)
        queued = max(prompt.prompt_tokens - predicted * prompt.block_tokens, 0)
        chosen.in_flight += 1
        chosen.queued_prefill_tokens += queued
        if prompt.hashes:
            self.index.record(chosen.url, prompt.hashes)
            if self.peers is not None:
                self.peers.placed(self.deployment.name, chosen.url, prompt.hashes)
        return Placement(replica=chosen, predicted_blocks=predicted, queued_tokens=queued)

    def first_token(self, placement: Placement) -> None:
        if placement.started or placement.finished:
            return
        placement.started = True
        replica = placement.replica
        replica.queued_prefill_tokens -= placement.queued_tokens
        replica.running += 1

    def finish(self, placement: Placement) -> None:
        if placement.finished:
            return
        placement.finished = True
        replica = placement.replica
        replica.in_flight -= 1
        if placement.started:
            replica.running -= 1
        else:
            replica.queued_prefill_tokens -= placement.queued_tokens

    def learn(
        self, route: Route, placement: Placement, *, cached_tokens: int, prompt_tokens: int
    ) -> None:
        """Fold a replica's reported cached tokens back into the index."""
        prompt = route.prompt
        reported = self.hasher.reported_blocks(prompt, cached_tokens, prompt_tokens)
        # vLLM never reports the block holding the prompt's last token as cached.
        predicted = min(placement.predicted_blocks, (prompt_tokens - 1) // prompt.block_tokens)
        if not prompt.exact and predicted - 1 <= reported < predicted:
            reported = predicted  # text chunks only approximate blocks: rounding, not eviction
        self.index.correct(
            placement.replica.url, prompt.hashes, reported, predicted_blocks=predicted
        )
        if self.peers is not None and reported != predicted:
            self.peers.corrected(
                self.deployment.name, placement.replica.url, prompt.hashes, reported, predicted
            )

    def apply_peer(
        self, kind: int, replica: str, hashes: Sequence[int], reported: int, predicted: int
    ) -> None:
        """Another worker's change to its index, made to this one the same way."""
        if replica not in self._urls or not hashes:
            return  # a worker with another configuration: not this fleet's replica
        if kind == PLACED:
            self.ceiling.observe(self.deployment.name, hashes)
            self.index.record(replica, hashes)
        elif kind == CORRECTED:
            self.index.correct(replica, hashes, reported, predicted_blocks=predicted)

    def predicted_tokens(self, route: Route, placement: Placement, prompt_tokens: int) -> int:
        return self.hasher.tokens(route.prompt, placement.predicted_blocks, prompt_tokens)

    def ceiling_tokens(self, route: Route, prompt_tokens: int) -> int:
        return self.hasher.tokens(route.prompt, route.ceiling_blocks, prompt_tokens)

    # -- what the replicas say about themselves -----------------------------------------

    def event_consumers(self) -> list[KvEventConsumer]:
        """One KV event consumer per replica that publishes, feeding the exact index."""
        if not self.deployment.kv_events:
            return []
        # ZeroMQ (60 ms to import) only for deployments that publish KV events.
        from gateway.routing.kv_events import KvEventConsumer, KvEventSource

        self.consumers = [
            KvEventConsumer(
                KvEventSource(replica.url, events.endpoint, events.replay_endpoint, events.topic),
                self.index.exact,
                on_fresh=self.index.set_fresh,
            )
            for replica, events in zip(self.replicas, self.deployment.kv_events, strict=True)
        ]
        return self.consumers

    async def read_loads(self, session: aiohttp.ClientSession) -> None:
        """Read every replica's /metrics: its load, and how it names blocks."""
        model = self.deployment.served_name
        loads = await asyncio.gather(
            *(read_load(session, r.url, model=model) for r in self.replicas)
        )
        for replica, load in zip(self.replicas, loads, strict=True):
            replica.load = load
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
            log.warning("replica %s of %s taken out", replica.url, self.deployment.name)
        replica.failures += 1
        replica.down_until = math.inf
        # A replica that went away may come back empty: its blocks are not to be trusted.
        self.index.forget(replica.url)

    def mark_up(self, replica: Replica) -> None:
        if replica.down_until:
            log.info("replica %s of %s back in rotation", replica.url, self.deployment.name)
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
