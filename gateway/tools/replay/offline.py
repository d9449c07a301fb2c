"""Offline replay: a discrete-event simulation of a fleet serving a trace under a policy.

The engines are simulated with the same `PrefixCache` per replica and the same timing as
the simulated replica (`gateway.tools.sim.timing`); the router is the gateway's own
placement code (`gateway.routing.placement`: views, in-flight and queued-prefill
accounting, capacity, prediction and learning), so what it measures is what the gateway
would do in front of ``kvgate sim`` replicas. Per replica:

- a request takes one of ``max_num_seqs`` sequence slots (others wait, FIFO); taking the
  slot is when the cache is looked up and the request's blocks are pinned and stored;
- prefills run one at a time in slot order, ``uncached / prefill_tokens_per_s`` seconds;
  the hit is capped at ``(prompt_tokens - 1) // block_tokens`` blocks as in vLLM;
- the first token comes ``1 / decode_tokens_per_s`` after the prefill, the last
  ``output_tokens / decode_tokens_per_s`` after it; then the slot is freed and the
  blocks are released tail first.

The router sees what a gateway can see: requests it has in flight per replica, which of
them have streamed a first token, and the uncached tokens it predicted for the rest. Its
block index is the gateway's `RoutingIndex`: the approximate index learning from its own
decisions and corrected by the cached tokens each response reports
(``index="approximate"``), or the exact index fed with every block the caches store and
evict, as KV events would feed it, and the placements they have not announced yet
predicted on route (``index="exact"``).

Tiers (``cpu_blocks``, ``disk_blocks`` per replica): each cache keeps what GPU memory
evicts in host memory, and what that evicts on disk; a hit there is loaded at the timing
model's ``cpu_block_ms`` / ``disk_block_ms`` per block, in the prefill queue. The router
credits such hits with tier weights derived from the same timing (`tier_weights`), and
its approximate index mirrors the tiers (the deployment's ``cpu_blocks``/``disk_blocks``).

Gateways (``gateways``: K): K independent router instances behind a round-robin
balancer, each with its own index and its own in-flight counts, none told of the others'
placements; each reads every replica's load (running and waiting requests, as
``/metrics`` says them) every ``load_interval_s`` as the gateway does. In exact mode each
follows every replica's events.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from gateway.routing.exact import ExactIndex, RoutingIndex
from gateway.routing.index import ApproximateIndex
from gateway.routing.load import ReplicaLoad
from gateway.routing.placement import Placement, Placer, Replica, Route, make_route
from gateway.routing.policy import DEFAULT_TUNABLES, Tunables
from gateway.routing.predicted import DEFAULT_PREDICTION_TTL_S, PredictedIndex
from gateway.routing.prompts import Prompt
from gateway.routing.tiers import GPU, MEDIA, TierWeights, weight
from gateway.tools.replay.trace import MOONCAKE_BLOCK_TOKENS, TraceRequest
from gateway.tools.sim.cache import Admission, PrefixCache
from gateway.tools.sim.timing import TimingModel

INDEX_MODES = ("approximate", "exact")

# Event kinds, in the order they are handled when they fall at the same instant.
_PREFILL_DONE, _FIRST_TOKEN, _FINISH = 0, 1, 2

# How often the replicas' in-flight counts are sampled for the load-over-time plot.
LOAD_SAMPLE_S = 10.0


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """The fleet being simulated and how its router sees it."""

    replicas: int = 8
    capacity_blocks: int = 4000
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    timing: TimingModel = field(default_factory=TimingModel)
    index: str = "approximate"
    tunables: Tunables = DEFAULT_TUNABLES
    # The replicas' names, as the live gateway names them (their URLs): policies break
    # ties by name. Default: replica-0, replica-1, ...
    replica_names: tuple[str, ...] = ()
    # What the router believes each cache holds at most (the deployment's capacity_blocks);
    # default: the caches' true size. Set apart, it measures a misconfigured deployment.
    index_capacity_blocks: int | None = None
    # Lower tiers per replica, in blocks (their load times are the timing's).
    cpu_blocks: int = 0
    disk_blocks: int = 0
    # What the router credits a hit in each tier with; default: derived from the timing.
    weights: TierWeights | None = None
    gateways: int = 1  # independent router instances behind a round-robin balancer
    # How often each router reads the replicas' own load; None: never (one router sees
    # all the load there is anyway).
    load_interval_s: float | None = None
    prediction_ttl_s: float = DEFAULT_PREDICTION_TTL_S

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")
        if self.index not in INDEX_MODES:
            raise ValueError(f"index must be one of {INDEX_MODES}, got {self.index!r}")
        if self.replica_names and len(set(self.replica_names)) != self.replicas:
            raise ValueError("replica_names must name each replica once")
        if self.index_capacity_blocks is not None and self.index_capacity_blocks < 1:
            raise ValueError("index_capacity_blocks must be at least 1")
        if self.cpu_blocks < 0 or self.disk_blocks < 0:
            raise ValueError("cpu_blocks and disk_blocks must be 0 or more")
        if self.disk_blocks and not self.cpu_blocks:
            raise ValueError("a disk tier needs a CPU tier above it (cpu_blocks)")
        if self.gateways < 1:
            raise ValueError("gateways must be at least 1")
        if self.load_interval_s is not None and self.load_interval_s <= 0:
            raise ValueError("load_interval_s must be positive")

    @property
    def lower_blocks(self) -> tuple[int, ...]:
        """The lower tiers' capacities per replica, host memory first."""
        return tuple(b for b in (self.cpu_blocks, self.disk_blocks) if b)

    @property
    def tier_weights(self) -> TierWeights:
        """The router's tier weights: given, or what the timing makes a hit in each tier
        save (1 - one block's load time / its prefill time)."""
        if self.weights is not None:
            return self.weights
        timing = self.timing
        prefill = timing.prefill_seconds(self.block_tokens)
        return TierWeights(
            cpu=weight(timing.cpu_block_ms / 1000.0, prefill),
            storage=weight(timing.disk_block_ms / 1000.0, prefill),
        )

    @property
    def names(self) -> tuple[str, ...]:
        """The replicas' names, in order."""
        return self.replica_names or tuple(f"replica-{i}" for i in range(self.replicas))


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's fate: where it went, what it hit, how long it waited."""

    arrival_s: float
    replica: int
    prompt_tokens: int
    cached_tokens: int
    predicted_cached_tokens: int
    output_tokens: int
    queue_s: float  # arrival to prefill start: waiting for a slot and for earlier prefills
    ttft_s: float  # arrival to first token
    cached_by_tier: tuple[int, int, int] = (0, 0, 0)  # tokens: GPU, host memory, disk
    gateway: int = 0  # the router instance that placed it


@dataclass(frozen=True, slots=True)
class LoadSample:
    """Requests in flight on each replica at one instant."""

    time_s: float
    in_flight: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """A policy's replay of a trace."""

    policy: str
    config: ReplayConfig
    outcomes: tuple[Outcome, ...]
    load: tuple[LoadSample, ...]


def replay(
    requests: Sequence[TraceRequest],
    policy: str,
    config: ReplayConfig,
    *,
    progress: Callable[[int], None] | None = None,
) -> PolicyRun:
    """Simulate the fleet serving ``requests`` (in arrival order) under ``policy``."""
    if any(a.timestamp_ms > b.timestamp_ms for a, b in itertools.pairwise(requests)):
        raise ValueError("requests must be in arrival order")
    return _Simulation(requests, policy, config).run(progress)


class _Engine:
    """One replica's engine: its prefix cache, sequence slots and prefill queue."""

    __slots__ = ("cache", "name", "prefill_busy", "prefills", "seated", "waiting")

    def __init__(self, name: str, capacity_blocks: int, lower: tuple[int, ...]) -> None:
        self.name = name
        self.cache = PrefixCache(capacity_blocks, lower=lower)
        self.waiting: deque[int] = deque()  # for a sequence slot
        self.prefills: deque[int] = deque()  # seated, for the prefill engine
        self.prefill_busy = False
        self.seated = 0


class _Router:
    """One gateway instance: the placement code over its own picture of the replicas."""

    __slots__ = ("exact", "index", "placer")

    def __init__(self, policy: str, config: ReplayConfig, max_seqs: int) -> None:
        believed = config.index_capacity_blocks or config.capacity_blocks
        self.index = RoutingIndex(
            ApproximateIndex(believed, lower=config.lower_blocks),
            ExactIndex(),
            predicted=PredictedIndex(config.prediction_ttl_s),
        )
        self.exact = config.index == "exact"
        if self.exact:
            for name in config.names:
                self.index.set_fresh(name, True)
        self.placer = Placer(
            [Replica(name, capacity=max_seqs) for name in config.names],
            self.index,
            policy=policy,
            tunables=config.tunables,
            tier_weights=config.tier_weights,
            name="replay",
        )


class _Simulation:
    def __init__(self, requests: Sequence[TraceRequest], policy: str, config: ReplayConfig):
        self.requests = requests
        self.policy = policy
        self.config = config
        timing = config.timing
        self.timing = timing
        self.prefill_rate = timing.prefill_tokens_per_s
        self.instant_prefill = timing.instant_prefill
        self.token_s = 0.0 if timing.instant_decode else 1.0 / timing.decode_tokens_per_s
        self.max_seqs = timing.max_num_seqs
        names = config.names
        lower = config.lower_blocks
        self.engines = [_Engine(name, config.capacity_blocks, lower) for name in names]
        self.position = {name: i for i, name in enumerate(names)}
        # What the routers know: the gateway's own placement, over their own records.
        self.routers = [_Router(policy, config, self.max_seqs) for _ in range(config.gateways)]
        self.exact = config.index == "exact"
        self.events: list[tuple[float, int, int, int]] = []
        count = len(requests)
        bt = config.block_tokens
        self.blocks = [r.cacheable(bt) for r in requests]
        # vLLM recomputes at least the last prompt token, so a hit stops short of it.
        self.hit_cap = [max(0, (r.input_length - 1) // bt) for r in requests]
        self.routes: list[Route | None] = [None] * count
        self.placements: list[Placement | None] = [None] * count
        self.router_of = [0] * count
        self.replica_of = [0] * count
        self.predicted = [0] * count  # blocks
        self.cached = [0] * count  # blocks
        self.cached_tiers: list[tuple[int, int, int]] = [(0, 0, 0)] * count  # blocks
        self.pinned: list[list[object]] = [[] for _ in range(count)]
        self.start = [0.0] * count
        self.first = [0.0] * count

    def run(self, progress: Callable[[int], None] | None) -> PolicyRun:
        requests = self.requests
        events = self.events
        samples: list[LoadSample] = []
        next_sample = 0.0
        interval = self.config.load_interval_s
        next_reading = 0.0
        for rid, request in enumerate(requests):
            now = request.timestamp_ms / 1000.0
            while events and events[0][0] <= now:
                self._handle(heapq.heappop(events))
            while next_sample <= now:
                samples.append(self._sample(next_sample))
                next_sample += LOAD_SAMPLE_S
            if interval is not None and next_reading <= now:
                self._read_loads()
                while next_reading <= now:
                    next_reading += interval
            self._route(rid, now)
            if progress is not None:
                progress(rid + 1)
        while events:
            self._handle(heapq.heappop(events))
        return PolicyRun(self.policy, self.config, self._outcomes(), tuple(samples))

    def _sample(self, time_s: float) -> LoadSample:
        in_flight = [0] * len(self.engines)
        for router in self.routers:
            for i, replica in enumerate(router.placer.replicas):
                in_flight[i] += replica.in_flight
        return LoadSample(time_s, tuple(in_flight))

    def _read_loads(self) -> None:
        """Every router reads every replica's /metrics: running and waiting requests."""
        loads = [ReplicaLoad(running=e.seated, waiting=len(e.waiting)) for e in self.engines]
        for router in self.routers:
            for replica, load in zip(router.placer.replicas, loads, strict=True):
                replica.read(load)

    def _route(self, rid: int, now: float) -> None:
        request = self.requests[rid]
        prompt = Prompt(self.blocks[rid], request.input_length, self.config.block_tokens, True)
        request_id = request.request_id or str(rid)
        route = make_route(
            prompt, request_id=request_id, interaction_id=request.interaction_id or request_id
        )
        gateway = rid % len(self.routers)  # the balancer's round robin
        placement = self.routers[gateway].placer.place(route, now=now)
        index = self.position[placement.replica.name]
        self.routes[rid] = route
        self.placements[rid] = placement
        self.router_of[rid] = gateway
        self.replica_of[rid] = index
        self.predicted[rid] = placement.predicted_blocks
        engine = self.engines[index]
        if engine.seated < self.max_seqs:
            self._seat(rid, engine, now)
        else:
            engine.waiting.append(rid)

    def _seat(self, rid: int, engine: _Engine, now: float) -> None:
        engine.seated += 1
        admission = engine.cache.admit(self.blocks[rid])
        if self.exact:
            self._announce(engine.name, admission)
        self.pinned[rid] = admission.pinned
        hits = admission.hit_tiers[: self.hit_cap[rid]]
        self.cached[rid] = len(hits)
        if engine.cache.lower_capacity:
            self.cached_tiers[rid] = (hits.count(0), hits.count(1), hits.count(2))
        else:
            self.cached_tiers[rid] = (len(hits), 0, 0)
        engine.prefills.append(rid)
        if not engine.prefill_busy:
            self._start_prefill(engine, now)

    def _announce(self, replica: str, admission: Admission) -> None:
        """What the replica's KV events would say, to every router: GPU memory's evictions,
        the lower tiers' changes in order, then the blocks stored in GPU memory."""
        for router in self.routers:
            index = router.index
            index.block_removed(replica, cast("list[int]", admission.evicted), medium=GPU)
            for tier, stored, block in admission.moves:
                change = index.block_stored if stored else index.block_removed
                change(replica, [cast("int", block)], medium=MEDIA[tier])
            index.block_stored(replica, cast("list[int]", admission.stored), medium=GPU)

    def _start_prefill(self, engine: _Engine, now: float) -> None:
        rid = engine.prefills.popleft()
        engine.prefill_busy = True
        self.start[rid] = now
        uncached = self.requests[rid].input_length - self.cached[rid] * self.config.block_tokens
        seconds = 0.0 if self.instant_prefill else uncached / self.prefill_rate
        tiers = self.cached_tiers[rid]
        if tiers[1] or tiers[2]:
            seconds += self.timing.fetch_seconds(tiers)
        heapq.heappush(self.events, (now + seconds, _PREFILL_DONE, rid, self.replica_of[rid]))

    def _handle(self, event: tuple[float, int, int, int]) -> None:
        now, kind, rid, index = event
        engine = self.engines[index]
        if kind == _PREFILL_DONE:
            output = self.requests[rid].output_length
            first = now + (self.token_s if output > 0 else 0.0)
            self.first[rid] = first
            heapq.heappush(self.events, (first, _FIRST_TOKEN, rid, index))
            heapq.heappush(self.events, (now + output * self.token_s, _FINISH, rid, index))
            engine.prefill_busy = False
            if engine.prefills:
                self._start_prefill(engine, now)
        elif kind == _FIRST_TOKEN:
            self.routers[self.router_of[rid]].placer.first_token(self._placement(rid))
        else:
            self._finish(rid, engine, now)

    def _finish(self, rid: int, engine: _Engine, now: float) -> None:
        engine.cache.release(self.pinned[rid])
        self.pinned[rid] = []
        engine.seated -= 1
        placement = self._placement(rid)
        placer = self.routers[self.router_of[rid]].placer
        placer.finish(placement)
        route = self.routes[rid]
        assert route is not None
        placer.learn(
            route,
            placement,
            cached_tokens=self.cached[rid] * self.config.block_tokens,
            prompt_tokens=self.requests[rid].input_length,
        )
        if engine.waiting:
            self._seat(engine.waiting.popleft(), engine, now)

    def _placement(self, rid: int) -> Placement:
        placement = self.placements[rid]
        assert placement is not None
        return placement

    def _outcomes(self) -> tuple[Outcome, ...]:
        bt = self.config.block_tokens
        out = []
        for rid, request in enumerate(self.requests):
            arrival = request.timestamp_ms / 1000.0
            out.append(
                Outcome(
                    arrival_s=arrival,
                    replica=self.replica_of[rid],
                    prompt_tokens=request.input_length,
                    cached_tokens=self.cached[rid] * bt,
                    predicted_cached_tokens=self.predicted[rid] * bt,
                    output_tokens=request.output_length,
                    queue_s=self.start[rid] - arrival,
                    ttft_s=self.first[rid] - arrival,
                    cached_by_tier=(
                        self.cached_tiers[rid][0] * bt,
                        self.cached_tiers[rid][1] * bt,
                        self.cached_tiers[rid][2] * bt,
                    ),
                    gateway=self.router_of[rid],
                )
            )
        return tuple(out)
