"""Offline replay: a discrete-event simulation of a fleet serving a trace under a policy.

It runs the SAME `policy.choose`, the SAME `PrefixCache` per replica and the same timing
as the simulated replica (`gateway.tools.sim.timing`), so what it measures is what the gateway
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
block index is an `ApproximateIndex` learning from its own decisions and corrected by the
cached tokens each response reports (``index="approximate"``), or the replicas' true cache
contents (``index="exact"``, what KV events would give).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.routing.index import ApproximateIndex
from gateway.routing.policy import DEFAULT_TUNABLES, ReplicaView, RouteRequest, Tunables, choose
from gateway.tools.replay.trace import MOONCAKE_BLOCK_TOKENS, TraceRequest
from gateway.tools.sim.cache import PrefixCache
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

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")
        if self.index not in INDEX_MODES:
            raise ValueError(f"index must be one of {INDEX_MODES}, got {self.index!r}")


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


class _Replica:
    """One replica's engine state and the router's bookkeeping for it."""

    __slots__ = (
        "cache",
        "decoding",
        "in_flight",
        "prefill_busy",
        "prefills",
        "queued_tokens",
        "seated",
        "waiting",
    )

    def __init__(self, capacity_blocks: int) -> None:
        self.cache = PrefixCache(capacity_blocks)
        self.waiting: deque[int] = deque()  # for a sequence slot
        self.prefills: deque[int] = deque()  # seated, for the prefill engine
        self.prefill_busy = False
        self.seated = 0
        # What the router knows.
        self.in_flight = 0
        self.decoding = 0
        self.queued_tokens = 0


class _Simulation:
    def __init__(self, requests: Sequence[TraceRequest], policy: str, config: ReplayConfig):
        self.requests = requests
        self.policy = policy
        self.config = config
        timing = config.timing
        self.prefill_rate = timing.prefill_tokens_per_s
        self.instant_prefill = timing.instant_prefill
        self.token_s = 0.0 if timing.instant_decode else 1.0 / timing.decode_tokens_per_s
        self.max_seqs = timing.max_num_seqs
        self.replicas = [_Replica(config.capacity_blocks) for _ in range(config.replicas)]
        self.names = [f"replica-{i}" for i in range(config.replicas)]
        self.index = ApproximateIndex(config.capacity_blocks)
        self.exact = config.index == "exact"
        self.events: list[tuple[float, int, int, int]] = []
        count = len(requests)
        bt = config.block_tokens
        self.blocks = [r.cacheable(bt) for r in requests]
        # vLLM recomputes at least the last prompt token, so a hit stops short of it.
        self.hit_cap = [max(0, (r.input_length - 1) // bt) for r in requests]
        self.replica_of = [0] * count
        self.predicted = [0] * count  # blocks
        self.cached = [0] * count  # blocks
        self.pinned: list[list[object]] = [[] for _ in range(count)]
        self.start = [0.0] * count
        self.first = [0.0] * count

    def run(self, progress: Callable[[int], None] | None) -> PolicyRun:
        requests = self.requests
        events = self.events
        samples: list[LoadSample] = []
        next_sample = 0.0
        for rid, request in enumerate(requests):
            now = request.timestamp_ms / 1000.0
            while events and events[0][0] <= now:
                self._handle(heapq.heappop(events))
            while next_sample <= now:
                samples.append(self._sample(next_sample))
                next_sample += LOAD_SAMPLE_S
            self._route(rid, now)
            if progress is not None:
                progress(rid + 1)
        while events:
            self._handle(heapq.heappop(events))
        return PolicyRun(self.policy, self.config, self._outcomes(), tuple(samples))

    def _sample(self, time_s: float) -> LoadSample:
        return LoadSample(time_s, tuple(r.in_flight for r in self.replicas))

    def _route(self, rid: int, now: float) -> None:
        request = self.requests[rid]
        blocks = self.blocks[rid]
        cap = self.hit_cap[rid]
        bt = self.config.block_tokens
        replicas = self.replicas
        if self.exact:
            matched = [min(r.cache.match(blocks), cap) for r in replicas]
        else:
            found = self.index.match_all(blocks)
            matched = [min(found.get(name, 0), cap) for name in self.names]
        views = [
            ReplicaView(
                name=self.names[i],
                matched_blocks=matched[i],
                in_flight=r.in_flight,
                queued_prefill_tokens=r.queued_tokens,
                running=r.decoding,
                capacity=self.max_seqs,
            )
            for i, r in enumerate(replicas)
        ]
        route = RouteRequest(
            seq=rid,
            key=rid,
            interaction=rid,
            prompt_tokens=request.input_length,
            block_tokens=bt,
        )
        chosen = choose(self.policy, route, views, self.config.tunables)
        replica = replicas[chosen]
        self.replica_of[rid] = chosen
        self.predicted[rid] = matched[chosen]
        replica.in_flight += 1
        replica.queued_tokens += self._predicted_uncached(rid)
        if not self.exact:
            self.index.record(self.names[chosen], blocks)
        if replica.seated < self.max_seqs:
            self._seat(rid, replica, now)
        else:
            replica.waiting.append(rid)

    def _predicted_uncached(self, rid: int) -> int:
        return max(
            0, self.requests[rid].input_length - self.predicted[rid] * self.config.block_tokens
        )

    def _seat(self, rid: int, replica: _Replica, now: float) -> None:
        replica.seated += 1
        admission = replica.cache.admit(self.blocks[rid])
        self.pinned[rid] = admission.pinned
        self.cached[rid] = min(admission.hit_blocks, self.hit_cap[rid])
        replica.prefills.append(rid)
        if not replica.prefill_busy:
            self._start_prefill(replica, now)

    def _start_prefill(self, replica: _Replica, now: float) -> None:
        rid = replica.prefills.popleft()
        replica.prefill_busy = True
        self.start[rid] = now
        uncached = self.requests[rid].input_length - self.cached[rid] * self.config.block_tokens
        seconds = 0.0 if self.instant_prefill else uncached / self.prefill_rate
        heapq.heappush(self.events, (now + seconds, _PREFILL_DONE, rid, self.replica_of[rid]))

    def _handle(self, event: tuple[float, int, int, int]) -> None:
        now, kind, rid, index = event
        replica = self.replicas[index]
        if kind == _PREFILL_DONE:
            output = self.requests[rid].output_length
            first = now + (self.token_s if output > 0 else 0.0)
            self.first[rid] = first
            heapq.heappush(self.events, (first, _FIRST_TOKEN, rid, index))
            heapq.heappush(self.events, (now + output * self.token_s, _FINISH, rid, index))
            replica.prefill_busy = False
            if replica.prefills:
                self._start_prefill(replica, now)
        elif kind == _FIRST_TOKEN:
            replica.queued_tokens -= self._predicted_uncached(rid)
            replica.decoding += 1
        else:
            self._finish(rid, index, replica, now)

    def _finish(self, rid: int, index: int, replica: _Replica, now: float) -> None:
        replica.cache.release(self.pinned[rid])
        self.pinned[rid] = []
        replica.seated -= 1
        replica.in_flight -= 1
        replica.decoding -= 1
        if not self.exact:
            self.index.correct(
                self.names[index],
                self.blocks[rid],
                self.cached[rid],
                predicted_blocks=self.predicted[rid],
            )
        if replica.waiting:
            self._seat(replica.waiting.popleft(), replica, now)

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
                )
            )
        return tuple(out)
