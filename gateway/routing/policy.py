"""Routing policies: pure functions from a snapshot of the fleet to a replica.

`choose` sees only values (the request, a view of each healthy replica, the tunables)
and returns an index into the views; it does no I/O and keeps no state, so the live
gateway and the offline replay run the very same code, and tests use plain lists.

kv-aware, the default, prices each replica in tokens of prefill::

    load   = queued_prefill_tokens + running_tokens * running
    limit  = imbalance_factor * mean(load over the fleet) + imbalance_floor_tokens
    cost   = (prompt_tokens - predicted_cached_tokens)          # its own prefill there
           + fetch_tokens                                       # loading slower tiers' hits
           + load_weight * load                                 # work queued before it
           + (1 - load_weight) * max(0, load - limit)           # the imbalance guard

``fetch_tokens`` prices the predicted hit's blocks held outside GPU memory in tokens of
prefill (each block at ``1 - weight`` of its tier, `gateway.routing.tiers`): a block in
host memory saves nearly its whole prefill, one on disk less.

``shared`` says whether the request's matched prefix is shared by other requests in
flight (a hot system prompt, a burst of siblings) or is its own (a conversation's
history, asked for one turn at a time). A shared prefix is held to the imbalance limit
above: when its holders cannot serve it inside the limit, the excess counts in full and
the next cheapest replica takes it, and holds it from then on, so a hot prefix spreads
over as many replicas as its traffic needs, chosen by cost, instead of piling onto its
first holder or scattering over all. A prefix of its own is held to the looser affinity
limit (``affinity_factor``, ``affinity_floor_tokens``): moving it gains nothing later
(one request at a time wants it) and loses its whole context now.

``load_weight = 1`` would make cost the request's own time to first token (in tokens of
prefill): greedy, and blind to the future. A smaller weight lets a replica that holds the
request's prefix keep it through moderate queueing, which matters because affinity
compounds (a conversation that stays put hits on every later turn; one that moves leaves
a dead copy behind). The guard bounds that: load beyond ``limit`` counts in full, so a
replica that exceeds the fleet's mean load by the factor is not chosen for cache
affinity unless the tokens its cache saves outweigh its excess load one for one, the
TTFT-greedy rule. The floor keeps a nearly idle fleet from looking imbalanced. The
defaults come from a sweep over conversation and shared-system-prompt workloads
(benchmarks/routing_sweep.py, results in benchmarks/README.md).

Replicas with every sequence slot taken (``in_flight >= capacity``) are chosen only when
all are. Ties go to the replica with fewer requests in flight, then to the highest
rendezvous weight of (request key, replica name): deterministic for a request, yet
spread over replicas across requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

POLICIES = ("kv-aware", "round-robin", "least-loaded", "random", "session")
# vLLM 0.32's `vllm serve` runs 256 sequences at once on most GPUs when not told otherwise
# (1,024 on H100/H200-class ones, 128 per rank on CPU): a deployment says its own.
DEFAULT_MAX_NUM_SEQS = 256

_MASK64 = (1 << 64) - 1
_hash = xxhash.xxh3_64_intdigest


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a policy may know about the request being routed."""

    seq: int  # monotonically increasing per router: round-robin's position
    key: int  # 64-bit hash of the request id: seeds random and breaks ties
    interaction: int  # 64-bit hash of the interaction id: session affinity
    prompt_tokens: int
    block_tokens: int  # tokens one index block stands for
    # Whether other requests in flight share its matched prefix (the imbalance limit
    # applies) or not (the affinity limit does).
    shared: bool = True


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """A healthy replica as the router sees it at this instant."""

    name: str
    matched_blocks: int = 0  # leading blocks of this prompt predicted cached there
    in_flight: int = 0  # requests sent and not finished
    queued_prefill_tokens: int = 0  # predicted uncached tokens of requests before prefill
    running: int = 0  # sequences past their first token (decoding)
    capacity: int = DEFAULT_MAX_NUM_SEQS  # sequences it runs at once (vLLM max_num_seqs)
    # Tokens of prefill that loading the matched blocks from slower tiers is worth.
    fetch_tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class Tunables:
    """kv-aware's knobs; defaults chosen by benchmarks/routing_sweep.py (see README)."""

    load_weight: float = 0.05
    # The simulated replica decodes without slowing prefill, so nothing measured here
    # supports a price per running sequence; on vLLM with chunked prefill, decodes share
    # each step's token budget, and a few hundred tokens per sequence is a fair start.
    running_tokens: float = 0.0
    imbalance_factor: float = 1.25
    imbalance_floor_tokens: int = 4_096
    # The limit for a prefix no other request in flight shares (a conversation's own).
    affinity_factor: float = 2.0
    affinity_floor_tokens: int = 65_536

    def __post_init__(self) -> None:
        if not 0.0 <= self.load_weight <= 1.0:
            raise ValueError("load_weight must be within [0, 1]")
        if self.running_tokens < 0 or self.imbalance_floor_tokens < 0:
            raise ValueError("running_tokens and imbalance_floor_tokens must be >= 0")
        if self.imbalance_factor < 1.0:
            raise ValueError("imbalance_factor must be at least 1")
        if self.affinity_factor < 1.0 or self.affinity_floor_tokens < 0:
            raise ValueError("affinity_factor must be at least 1, affinity_floor_tokens >= 0")


DEFAULT_TUNABLES = Tunables()


class NoReplicaError(ValueError):
    """No healthy replica to choose from."""


def choose(
    policy: str,
    request: RouteRequest,
    replicas: Sequence[ReplicaView],
    tunables: Tunables = DEFAULT_TUNABLES,
) -> int:
    """Index into ``replicas`` of the replica that should serve ``request``."""
    if not replicas:
        raise NoReplicaError("no healthy replica")
    match policy:
        case "kv-aware":
            return _kv_aware(request, replicas, tunables)
        case "round-robin":
            return request.seq % len(replicas)
        case "least-loaded":
            return _least_loaded(request, replicas)
        case "random":
            return _mix(request.key) % len(replicas)
        case "session":
            return _rendezvous(request.interaction, replicas)
        case _:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")


def kv_costs(
    request: RouteRequest, replicas: Sequence[ReplicaView], tunables: Tunables
) -> list[float]:
    """kv-aware's cost of each replica (the guard applied), for inspection and tests."""
    running_tokens = tunables.running_tokens
    loads = [r.queued_prefill_tokens + running_tokens * r.running for r in replicas]
    mean = sum(loads) / len(loads)
    if request.shared:
        limit = tunables.imbalance_factor * mean + tunables.imbalance_floor_tokens
    else:
        limit = tunables.affinity_factor * mean + tunables.affinity_floor_tokens
    load_weight = tunables.load_weight
    prompt = request.prompt_tokens
    block_tokens = request.block_tokens
    costs: list[float] = []
    excess_weight = 1.0 - load_weight
    for replica, load in zip(replicas, loads, strict=True):
        cached = min(replica.matched_blocks * block_tokens, prompt)
        cost = prompt - cached + replica.fetch_tokens + load_weight * load
        if load > limit:
            cost += excess_weight * (load - limit)
        costs.append(cost)
    return costs


def _kv_aware(request: RouteRequest, replicas: Sequence[ReplicaView], tunables: Tunables) -> int:
    costs = kv_costs(request, replicas, tunables)
    keys = [
        (replica.in_flight >= replica.capacity, cost, replica.in_flight)
        for replica, cost in zip(replicas, costs, strict=True)
    ]
    return _lowest(request, replicas, keys)


def _least_loaded(request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
    keys = [(replica.in_flight, replica.queued_prefill_tokens) for replica in replicas]
    return _lowest(request, replicas, keys)


def _lowest(
    request: RouteRequest, replicas: Sequence[ReplicaView], keys: Sequence[tuple[Any, ...]]
) -> int:
    """The replica of the lowest key; replicas tied on it, broken by the request's key."""
    best = -1
    best_key: tuple[Any, ...] | None = None
    tied: list[int] = []
    for i, key in enumerate(keys):
        if best_key is None or key < best_key:
            best, best_key, tied = i, key, []
        elif key == best_key:
            if not tied:
                tied.append(best)
            tied.append(i)
    return _break_tie(request.key, replicas, tied) if tied else best


def _break_tie(key: int, replicas: Sequence[ReplicaView], tied: list[int]) -> int:
    seed = key & _MASK64
    return max(tied, key=lambda i: (_hash(replicas[i].name.encode(), seed), -i))


def _rendezvous(seed: int, replicas: Sequence[ReplicaView]) -> int:
    """Highest random weight: a replica leaving moves only its own interactions."""
    seed &= _MASK64
    weights = [_hash(r.name.encode(), seed) for r in replicas]
    return max(range(len(replicas)), key=lambda i: (weights[i], -i))


def _mix(value: int) -> int:
    """splitmix64's finaliser: spreads any 64-bit key evenly over replicas."""
    value &= _MASK64
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK64
    return value ^ (value >> 31)
