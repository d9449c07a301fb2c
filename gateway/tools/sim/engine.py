"""The simulated replica's engine: prefix cache, scheduler and counters, without HTTP.

One request is a `Generation`, used as::

    async with engine.run(request) as generation:   # waits for a slot, looks up the cache
        async for tokens in generation.batches():    # prefill, then output tokens
            ...
    generation.cached_tokens, generation.completion_tokens

Leaving the ``async with`` (normally, by error, or by cancellation when the client goes
away) frees the slot and unpins the request's blocks, tail first, as vLLM does.

What it keeps from vLLM v1: the cache is looked up when a request is scheduled; the hit
is capped at ``(prompt_tokens - 1) // block_size`` full blocks because vLLM always
recomputes at least the last prompt token; output tokens fill blocks that are cached too
(all but the last sampled token, which is never fed back), so a next turn that repeats the
answer hits it; metrics count tokens the way vLLM's prefix-cache counters do.

With lower tiers (``lower_blocks``: host memory, then disk) the cache keeps what GPU
memory evicts (`gateway.tools.sim.cache`); a hit there is loaded at the timing model's
cost per block instead of prefilled, counted as cached (vLLM counts a connector's hits
in ``cached_tokens``), and by tier in ``cached_by_tier`` and the metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.routing.sim_tokenizer import piece_id
from gateway.tools.lcg import draws
from gateway.tools.sim.cache import PrefixCache
from gateway.tools.sim.hashing import block_hashes, extend_hashes
from gateway.tools.sim.timing import TimingModel

if TYPE_CHECKING:
    from gateway.tools.sim.events import CacheEvents

# The simulated model's whole vocabulary of answers: one word, one token.
WORDS = (
    "the", "cache", "block", "token", "prefix", "model", "replica", "gateway",
    "router", "tenant", "salt", "hash", "chain", "queue", "batch", "decode",
    "prefill", "stream", "chunk", "usage", "price", "cost", "ledger", "record",
    "window", "context", "prompt", "answer", "signal", "vector", "matrix", "kernel",
    "memory", "latency", "budget", "invoice", "statement", "rate", "hit", "miss",
    "evict", "reuse", "warm", "cold", "fast", "steady", "exact", "simple",
    "quiet", "bright", "river", "stone", "cloud", "field", "orbit", "harbor",
    "lantern", "meadow", "summit", "thread", "anchor", "beacon", "canvas", "delta",
)  # fmt: skip

FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the engine needs of a request: prompt token ids, output length, salt."""

    prompt_token_ids: Sequence[int]
    max_tokens: int
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class Token:
    """One output token: its id and its text."""

    id: int
    text: str


@dataclass(slots=True)
class EngineStats:
    """Running totals for /metrics, named after vLLM's counters (tokens, not requests)."""

    running: int = 0
    waiting: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0  # from GPU memory (vLLM's local prefix cache)
    # Cached tokens by tier: GPU memory, host memory, disk (vLLM's cache hit sources).
    cached_by_tier: list[int] = field(default_factory=lambda: [0, 0, 0])
    # Tokens asked of the lower tiers (vLLM's KV connector): those GPU memory missed.
    external_queries: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(
        default_factory=lambda: {"stop": 0, FINISH_LENGTH: 0, FINISH_ABORT: 0}
    )


class Engine:
    """One simulated vLLM replica's state: prefix cache, scheduler, counters."""

    def __init__(
        self,
        *,
        block_size: int = 16,
        capacity_blocks: int = 2048,
        timing: TimingModel | None = None,
        seed: int = 0,
        cache_output_blocks: bool = True,
        events: CacheEvents | None = None,
        lower_blocks: Sequence[int] = (),
    ) -> None:
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self.block_size = block_size
        self.cache = PrefixCache(capacity_blocks, lower=lower_blocks)
        self.timing = timing if timing is not None else TimingModel()
        self.seed = seed
        self.cache_output_blocks = cache_output_blocks
        # KV events (BlockStored / BlockRemoved / AllBlocksCleared), when enabled.
        self.events = events
        self.stats = EngineStats()
        self._slots = asyncio.Semaphore(self.timing.max_num_seqs)
        self._prefill = asyncio.Lock()
        # Inner words carry the space that separates them from the next; the last does not.
        self._inner = tuple(Token(piece_id(w + " "), w + " ") for w in WORDS)
        self._last = tuple(Token(piece_id(w), w) for w in WORDS)

    def run(self, request: GenerationRequest) -> Generation:
        """A request on this engine, to be entered with ``async with``."""
        return Generation(self, request)

    def reset_prefix_cache(self) -> None:
        """Drop every cached block that no running request holds."""
        cache = self.cache
        lower = [cache.tier_blocks(t) for t in range(1, len(cache.lower_capacity) + 1)]
        dropped = cache.clear()
        if self.events is not None:
            self.events.cleared(dropped, everything=len(cache) == 0, lower=lower)

    def output_tokens(self, prompt_token_ids: Sequence[int], count: int) -> list[Token]:
        """The deterministic answer to a prompt: a function of the prompt and the seed only."""
        digest = hashlib.blake2b(
            array("q", prompt_token_ids).tobytes(),
            digest_size=8,
            key=self.seed.to_bytes(8, "little", signed=True),
        ).digest()
        picks = draws(int.from_bytes(digest, "little"))
        inner = self._inner
        out = [inner[next(picks)] for _ in range(count - 1)]
        if count > 0:
            out.append(self._last[next(picks)])
        return out


class Generation:
    """One request's life on the engine: queued, scheduled, prefilled, decoded, released."""

    def __init__(self, engine: Engine, request: GenerationRequest) -> None:
        self.engine = engine
        self.request = request
        self.prompt_tokens = len(request.prompt_token_ids)
        self.cached_tokens = 0
        self.cached_by_tier = (0, 0, 0)  # tokens: GPU memory, host memory, disk
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self._hashes: list[bytes] = []
        self._pinned: list[Hashable] = []
        self._output: list[Token] = []

    async def __aenter__(self) -> Generation:
        engine = self.engine
        stats = engine.stats
        stats.waiting += 1
        try:
            await engine._slots.acquire()
        finally:
            stats.waiting -= 1
        stats.running += 1
        self._schedule()
        return self

    async def __aexit__(self, *exc: object) -> None:
        engine = self.engine
        if self.finish_reason is None:
            self.finish_reason = FINISH_ABORT
        engine.stats.finished[self.finish_reason] += 1
        output_pins = self._cache_output()
        engine.cache.release(output_pins)
        engine.cache.release(self._pinned)
        engine.stats.running -= 1
        engine._slots.release()

    async def batches(self) -> AsyncIterator[list[Token]]:
        """Output tokens as they are produced: each batch is what is ready at one moment."""
        engine = self.engine
        timing = engine.timing
        fetch = timing.fetch_seconds([t // engine.block_size for t in self.cached_by_tier])
        if not timing.instant_prefill or fetch:
            async with engine._prefill:
                uncached = self.prompt_tokens - self.cached_tokens
                await asyncio.sleep(timing.prefill_seconds(uncached) + fetch)
        output = self._output
        if timing.instant_decode:
            self._emit(len(output))
            yield output
        else:
            loop = asyncio.get_running_loop()
            start = loop.time()
            interval = 1.0 / timing.decode_tokens_per_s
            for index, token in enumerate(output, 1):
                # Deadlines from the start, so per-token sleeps do not drift.
                await asyncio.sleep(max(0.0, start + index * interval - loop.time()))
                self._emit(1)
                yield [token]
        self.finish_reason = FINISH_LENGTH

    async def text(self) -> str:
        """The whole answer, once decoded."""
        parts: list[str] = []
        async for batch in self.batches():
            parts.extend(token.text for token in batch)
        return "".join(parts)

    def _schedule(self) -> None:
        engine = self.engine
        request = self.request
        block_size = engine.block_size
        self._hashes = block_hashes(request.prompt_token_ids, block_size, request.cache_salt)
        admission = engine.cache.admit(self._hashes)
        if engine.events is not None:
            engine.events.admitted(
                admission, self._hashes, request.prompt_token_ids, request.cache_salt
            )
        self._pinned = admission.pinned
        cap = max(0, (self.prompt_tokens - 1) // block_size)
        hits = admission.hit_tiers[:cap]
        self.cached_tokens = len(hits) * block_size
        by_tier = [0, 0, 0]
        for tier in hits:
            by_tier[tier] += block_size
        self.cached_by_tier = (by_tier[0], by_tier[1], by_tier[2])
        self._output = engine.output_tokens(request.prompt_token_ids, request.max_tokens)
        stats = engine.stats
        stats.prefix_cache_queries += self.prompt_tokens
        stats.prefix_cache_hits += by_tier[0]
        if engine.cache.lower_capacity:
            stats.external_queries += self.prompt_tokens - by_tier[0]
        for tier, tokens in enumerate(by_tier):
            stats.cached_by_tier[tier] += tokens
        stats.prompt_tokens += self.prompt_tokens

    def _emit(self, count: int) -> None:
        self.completion_tokens += count
        self.engine.stats.generation_tokens += count

    def _cache_output(self) -> list[Hashable]:
        """Store the full blocks that output tokens filled; returns the pins taken."""
        engine = self.engine
        # The last sampled token is never fed back, so its KV is never computed.
        fed = self.completion_tokens - 1
        if not engine.cache_output_blocks or fed < 1:
            return []
        block_size = engine.block_size
        if (self.prompt_tokens + fed) // block_size <= len(self._hashes):
            return []
        tokens = list(self.request.prompt_token_ids)
        tokens.extend(token.id for token in self._output[:fed])
        chain = extend_hashes(self._hashes, tokens, block_size, self.request.cache_salt)
        admission = engine.cache.admit(chain)
        if engine.events is not None:
            engine.events.admitted(admission, chain, tokens, self.request.cache_salt)
        return admission.pinned
