"""The engine's prefix cache as vLLM reports it: full-block hits, salt, LRU, output blocks."""

from __future__ import annotations

import asyncio

from gateway.tools.sim.engine import Engine, GenerationRequest
from gateway.tools.sim.timing import TimingModel


def make_engine(
    *,
    capacity_blocks: int = 64,
    cache_output_blocks: bool = False,
    timing: TimingModel | None = None,
) -> Engine:
    return Engine(
        block_size=4,
        capacity_blocks=capacity_blocks,
        timing=timing or TimingModel.zero(),
        cache_output_blocks=cache_output_blocks,
    )


async def cached(
    engine: Engine, prompt: list[int], *, salt: str | None = None, out: int = 2
) -> int:
    async with engine.run(GenerationRequest(prompt, out, salt)) as generation:
        await generation.text()
    return generation.cached_tokens


async def test_a_repeated_prompt_hits_its_full_blocks() -> None:
    engine = make_engine()
    prompt = list(range(10))
    assert await cached(engine, prompt) == 0
    assert await cached(engine, prompt) == 8


async def test_the_last_prompt_token_is_always_recomputed() -> None:
    """vLLM caps the hit at prompt_tokens - 1, rounded down to full blocks."""
    engine = make_engine()
    prompt = list(range(8))
    await cached(engine, prompt)
    assert await cached(engine, prompt) == 4
    assert await cached(engine, [*prompt, 99]) == 8
    assert await cached(engine, [1]) == 0


async def test_a_different_salt_gets_nothing_and_the_same_salt_hits() -> None:
    engine = make_engine()
    prompt = list(range(10))
    await cached(engine, prompt, salt="tenant-a")
    assert await cached(engine, prompt, salt="tenant-b") == 0
    assert await cached(engine, prompt) == 0
    assert await cached(engine, prompt, salt="tenant-a") == 8


async def test_a_partly_shared_prompt_hits_exactly_the_shared_full_blocks() -> None:
    engine = make_engine()
    await cached(engine, list(range(20)))
    assert await cached(engine, [*range(10), 500, 501, 502, 503]) == 8
    assert await cached(engine, [*range(3), 700, *range(4, 20)]) == 0


async def test_lru_eviction_with_a_small_cache_drops_the_least_recent_prompt() -> None:
    engine = make_engine(capacity_blocks=4)
    a, b, c = list(range(9)), list(range(100, 109)), list(range(200, 209))
    await cached(engine, a)
    await cached(engine, b)
    await cached(engine, c)  # evicts a's two blocks, freed before b's
    assert await cached(engine, b) == 8
    assert await cached(engine, a) == 0


async def test_a_requests_tail_is_evicted_before_its_head() -> None:
    engine = make_engine(capacity_blocks=3)
    a, c = list(range(9)), list(range(200, 209))
    await cached(engine, a)
    await cached(engine, c)  # one free slot, then evicts a's tail block
    assert await cached(engine, a) == 4


async def test_running_requests_pin_their_blocks() -> None:
    engine = make_engine(capacity_blocks=2)
    a, b = list(range(9)), list(range(100, 109))
    async with engine.run(GenerationRequest(a, 1)) as running:
        assert engine.cache.usage == 1.0
        # No room: b runs but stores nothing; a's blocks stay.
        await cached(engine, b)
        await running.text()
    assert await cached(engine, a) == 8
    assert await cached(engine, b) == 0


async def test_output_blocks_are_cached_for_the_next_turn() -> None:
    """All output tokens but the last (never fed back) fill cacheable blocks, as in vLLM."""
    engine = make_engine(cache_output_blocks=True)
    prompt = list(range(6))
    async with engine.run(GenerationRequest(prompt, 7)) as generation:
        await generation.text()
    output = engine.output_tokens(prompt, 7)
    next_turn = prompt + [token.id for token in output] + [900, 901, 902]
    # 6 prompt + 6 fed output tokens = 12 tokens = 3 full blocks.
    assert await cached(engine, next_turn) == 12


async def test_without_output_caching_only_prompt_blocks_hit() -> None:
    engine = make_engine(cache_output_blocks=False)
    prompt = list(range(6))
    await cached(engine, prompt, out=7)
    output = engine.output_tokens(prompt, 7)
    assert await cached(engine, prompt + [token.id for token in output] + [900]) == 4


async def test_output_is_deterministic_and_exactly_max_tokens_long() -> None:
    engine = make_engine()
    async with engine.run(GenerationRequest(list(range(5)), 5)) as generation:
        text = await generation.text()
    assert generation.completion_tokens == 5
    assert generation.finish_reason == "length"
    assert len(text.split(" ")) == 5
    assert text == "".join(t.text for t in make_engine().output_tokens(list(range(5)), 5))
    assert text != "".join(t.text for t in Engine(seed=1).output_tokens(list(range(5)), 5))


async def test_counters_add_up_to_the_usage_reported() -> None:
    engine = make_engine()
    await cached(engine, list(range(10)), out=3)
    await cached(engine, list(range(10)), out=4)
    stats = engine.stats
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (20, 8)
    assert (stats.prompt_tokens, stats.generation_tokens) == (20, 7)
    assert stats.finished == {"stop": 0, "length": 2, "abort": 0}
    assert (stats.running, stats.waiting) == (0, 0)


async def test_a_cancelled_request_releases_its_slot_and_blocks() -> None:
    engine = make_engine(timing=TimingModel(prefill_tokens_per_s=0, decode_tokens_per_s=1000))

    async def consume() -> None:
        async with engine.run(GenerationRequest(list(range(10)), 1000)) as generation:
            await generation.text()

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)
    assert (engine.stats.running, engine.cache.usage) == (1, 2 / 64)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert (engine.stats.running, engine.cache.usage) == (0, 0.0)
    assert engine.stats.finished["abort"] == 1
    assert 0 < engine.stats.generation_tokens < 1000


async def test_reset_prefix_cache_drops_unpinned_blocks() -> None:
    engine = make_engine()
    await cached(engine, list(range(10)))
    engine.reset_prefix_cache()
    assert await cached(engine, list(range(10))) == 0
