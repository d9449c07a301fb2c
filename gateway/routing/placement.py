"""Where a request goes, and what the router believes afterwards: one module for the live
fleet (`gateway.routing.fleet`) and the offline replay (`gateway.tools.replay.offline`),
so that replay's figures are about the code the gateway runs.

    Route (a prompt's blocks, its keys) ─▶ Placer.place:
        candidates (available, not tried yet) ─▶ index.match_all ─▶ a view of each
        (leading blocks predicted cached there, capped where vLLM caps a hit; what
        fetching those held in slower tiers costs; requests in flight; queued prefill;
        running; capacity) ─▶ policy.choose
    ─▶ Placement: one more in flight there, its predicted uncached tokens queued, its
       blocks recorded in the index (predicted on route: `gateway.routing.predicted`)
    first_token ─▶ its queued prefill becomes a running sequence
    finish ─▶ out of flight

Whether a request's matched prefix is shared by others in flight (the policy's
``shared``: a hot prefix is spread, a conversation's own kept) is told by marks: each
request in flight counts a few of its blocks (positions 0, 1, 3, 7, 15, ...: about 11
for a 32k-token prompt), and a request shares its prefix when another request in flight
counts the deepest mark inside the run matched for it.
    learn (cached tokens the replica reported) ─▶ the index corrected

No I/O and no clock (time is passed in). One Placer is one router's picture of the
replicas: each gateway worker, or each gateway instance a replay models, has its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from gateway.routing.exact import RoutingIndex
from gateway.routing.load import ReplicaLoad
from gateway.routing.policy import (
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_TUNABLES,
    ReplicaView,
    RouteRequest,
    Tunables,
    choose,
)
from gateway.routing.prompts import Prompt
from gateway.routing.tiers import DEFAULT_TIER_WEIGHTS, TierWeights


class NoReplicaAvailable(Exception):
    """Every replica is down or has been tried already."""


@dataclass(slots=True)
class Replica:
    """One replica as one router knows it: the load it sent there, its health, and the
    replica's own last reading of its load."""

    name: str  # the live fleet names a replica by its base URL
    capacity: int = DEFAULT_MAX_NUM_SEQS  # sequences it runs at once (max_num_seqs)
    in_flight: int = 0  # requests sent and not finished
    queued_prefill_tokens: int = 0  # predicted uncached tokens of requests before first token
    running: int = 0  # requests past their first token
    down_until: float = 0.0
    failures: int = 0
    load: ReplicaLoad | None = None  # its /metrics, when read (other routers' requests too)
    # This router's placements there less its finishes, since that reading.
    since_reading: int = 0

    def read(self, load: ReplicaLoad | None) -> None:
        """A new reading of the replica's own load."""
        self.load = load
        self.since_reading = 0

    @property
    def url(self) -> str:
        """The replica's base URL (the live fleet's name for it)."""
        return self.name

    def available(self, now: float) -> bool:
        """Whether the replica is in rotation at ``now``."""
        return self.down_until <= now


@dataclass(frozen=True, slots=True)
class Route:
    """The routing facts of one request, computed once for all its attempts."""

    prompt: Prompt
    key: int  # of the request id: seeds random and breaks ties
    interaction: int  # of the interaction id: session affinity
    ceiling_blocks: int = 0  # leading blocks seen before anywhere (the live fleet's ceiling)


@dataclass(slots=True)
class Placement:
    """One attempt's place on a replica, and what the router expected there."""

    replica: Replica
    predicted_blocks: int
    queued_tokens: int
    started: bool = False
    finished: bool = False
    marks: tuple[int, ...] = ()  # the blocks it counts while in flight


@dataclass(frozen=True, slots=True)
class Correction:
    """What one reply taught the index: blocks reported cached against blocks predicted."""

    replica: str
    reported_blocks: int
    predicted_blocks: int


def route_key(text: str) -> int:
    """A request or interaction id as the 64-bit key policies take."""
    return xxhash.xxh3_64_intdigest(text.encode())


def make_route(
    prompt: Prompt, *, request_id: str, interaction_id: str, ceiling_blocks: int = 0
) -> Route:
    """A request's route: its prompt's blocks and the keys of its ids."""
    return Route(prompt, route_key(request_id), route_key(interaction_id), ceiling_blocks)


def hit_cap(prompt: Prompt) -> int:
    """The most leading blocks a replica can serve from cache: vLLM always computes the
    prompt's last token, so the block holding it never counts."""
    return max(0, (prompt.prompt_tokens - 1) // prompt.block_tokens)


def tokens_for_blocks(prompt: Prompt, blocks: int, reported_prompt_tokens: int) -> int:
    """Cached tokens that ``blocks`` leading blocks stand for, as vLLM would report them.

    At most (prompt - 1) // block_size full blocks count; in text mode blocks are scaled
    to the reported prompt length.
    """
    if reported_prompt_tokens <= 0 or not prompt.hashes:
        return 0
    if not prompt.exact:
        # A text chunk stands for about one block of the estimated prompt length.
        blocks = blocks * reported_prompt_tokens // max(prompt.prompt_tokens, 1)
    usable = (reported_prompt_tokens - 1) // prompt.block_tokens
    return min(blocks, usable) * prompt.block_tokens


def reported_blocks(prompt: Prompt, cached: int, reported_prompt_tokens: int) -> int:
    """Leading blocks of ``prompt.hashes`` that the replica reported as cached."""
    if not prompt.hashes or reported_prompt_tokens <= 0:
        return 0
    blocks = cached // prompt.block_tokens
    if not prompt.exact:
        blocks = blocks * prompt.prompt_tokens // reported_prompt_tokens
    return min(blocks, len(prompt.hashes))


def marks(hashes: Sequence[int]) -> tuple[int, ...]:
    """The blocks at positions 0, 1, 3, 7, 15, ... of a prompt: what a request in flight
    counts so that others can tell whether they share its prefix."""
    out = []
    position = 0
    count = len(hashes)
    while position < count:
        out.append(hashes[position])
        position = 2 * position + 1
    return tuple(out)


def mark_of(hashes: Sequence[int], depth: int) -> int | None:
    """The deepest mark inside the first ``depth`` blocks (None for no blocks)."""
    if depth <= 0:
        return None
    position = 0
    while 2 * position + 1 < depth:
        position = 2 * position + 1
    return hashes[position]


def view(replica: Replica, matched_blocks: int, fetch_tokens: float = 0.0) -> ReplicaView:
    """The policy's view of a replica: this router's counts, or the replica's own when
    they are higher (other routers' requests are there too), brought up to date with
    what this router placed there and saw finish since the reading (without that, every
    instance of a gateway would send a second's worth of requests to whichever replica
    read as least loaded)."""
    running, in_flight = replica.running, replica.in_flight
    load = replica.load
    if load is not None:
        running = max(running, load.running)
        in_flight = max(in_flight, load.running + load.waiting + replica.since_reading)
    return ReplicaView(
        name=replica.name,
        matched_blocks=matched_blocks,
        in_flight=in_flight,
        queued_prefill_tokens=replica.queued_prefill_tokens,
        running=running,
        capacity=replica.capacity,
        fetch_tokens=fetch_tokens,
    )


class Placer:
    """One router's bookkeeping over a set of replicas: placing, load, learning."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        index: RoutingIndex,
        *,
        policy: str = "kv-aware",
        tunables: Tunables = DEFAULT_TUNABLES,
        tier_weights: TierWeights = DEFAULT_TIER_WEIGHTS,
        name: str = "",
    ) -> None:
        self.replicas = list(replicas)
        self.index = index
        self.policy = policy
        self.tunables = tunables
        self.weights = tier_weights.by_rank()
        self.name = name  # the model, for messages
        self._sequence = itertools.count()
        self._marked: dict[int, int] = {}  # block → requests in flight counting it

    def place(
        self, route: Route, *, now: float, exclude: frozenset[str] = frozenset()
    ) -> Placement:
        """Choose a replica for one attempt and count it as in flight there."""
        candidates = [r for r in self.replicas if r.name not in exclude and r.available(now)]
        if not candidates:
            raise NoReplicaAvailable(f"no healthy replica for model {self.name!r}; retry shortly")
        prompt = route.prompt
        hashes = prompt.hashes
        index = self.index
        index.expire(now)
        matched = index.match_all(hashes) if hashes else {}
        cap = hit_cap(prompt)
        deepest = mark_of(hashes, max(matched.values(), default=0))
        shared = deepest is not None and self._marked.get(deepest, 0) > 0
        views = []
        for r in candidates:
            depth = min(matched.get(r.name, 0), cap)
            fetch = 0.0
            if depth:
                fetch = index.fetch_blocks(r.name, hashes, depth, self.weights)
            views.append(view(r, depth, fetch * prompt.block_tokens))
        request = RouteRequest(
            seq=next(self._sequence),
            key=route.key,
            interaction=route.interaction,
            prompt_tokens=prompt.prompt_tokens,
            block_tokens=prompt.block_tokens,
            shared=shared,
        )
        chosen = choose(self.policy, request, views, self.tunables)
        replica = candidates[chosen]
        predicted = views[chosen].matched_blocks
        fetch_tokens = round(views[chosen].fetch_tokens)
        queued = max(prompt.prompt_tokens - predicted * prompt.block_tokens, 0) + fetch_tokens
        replica.in_flight += 1
        replica.since_reading += 1
        replica.queued_prefill_tokens += queued
        placement = Placement(replica=replica, predicted_blocks=predicted, queued_tokens=queued)
        if hashes:
            index.record(replica.name, hashes, now=now, start=matched.get(replica.name, 0))
            placement.marks = marks(hashes)
            marked = self._marked
            for block in placement.marks:
                marked[block] = marked.get(block, 0) + 1
        return placement

    def first_token(self, placement: Placement) -> None:
        """The attempt's first token came: its prefill is done, it decodes."""
        if placement.started or placement.finished:
            return
        placement.started = True
        replica = placement.replica
        replica.queued_prefill_tokens -= placement.queued_tokens
        replica.running += 1

    def finish(self, placement: Placement) -> None:
        """The attempt ended (any way): it leaves the replica's load."""
        if placement.finished:
            return
        placement.finished = True
        replica = placement.replica
        replica.in_flight -= 1
        replica.since_reading -= 1
        marked = self._marked
        for block in placement.marks:
            left = marked[block] - 1
            if left:
                marked[block] = left
            else:
                del marked[block]
        if placement.started:
            replica.running -= 1
        else:
            replica.queued_prefill_tokens -= placement.queued_tokens

    def learn(
        self, route: Route, placement: Placement, *, cached_tokens: int, prompt_tokens: int
    ) -> Correction:
        """Fold a replica's reported cached tokens back into the index."""
        prompt = route.prompt
        reported = reported_blocks(prompt, cached_tokens, prompt_tokens)
        # vLLM never reports the block holding the prompt's last token as cached.
        usable = max(0, (prompt_tokens - 1) // prompt.block_tokens)
        predicted = min(placement.predicted_blocks, usable)
        if not prompt.exact and predicted - 1 <= reported < predicted:
            reported = predicted  # text chunks only approximate blocks: rounding, not eviction
        name = placement.replica.name
        self.index.correct(name, prompt.hashes, reported, predicted_blocks=predicted)
        return Correction(name, reported, predicted)
