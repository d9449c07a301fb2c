"""The timing model: rates, instant mode, FIFO queueing beyond max_num_seqs, serial prefill."""

from __future__ import annotations

import asyncio
import math

import pytest

from gateway.tools.sim.engine import Engine, GenerationRequest
from gateway.tools.sim.timing import TimingModel


def test_defaults_and_durations() -> None:
    timing = TimingModel()
    assert (timing.prefill_tokens_per_s, timing.decode_tokens_per_s, timing.max_num_seqs) == (
        10_000.0,
        40.0,
        64,
    )
    assert timing.prefill_seconds(2_500) == 0.25
    assert timing.decode_seconds(4) == 0.1


def test_zero_and_infinite_rates_are_instant() -> None:
    zero = TimingModel.zero()
    assert zero.prefill_seconds(1_000_000) == 0.0
    assert zero.decode_seconds(1_000_000) == 0.0
    assert zero.max_num_seqs >= 1 << 20
    assert TimingModel(prefill_tokens_per_s=0, decode_tokens_per_s=math.inf).instant_prefill


@pytest.mark.parametrize(
    "kwargs",
    [{"prefill_tokens_per_s": -1}, {"decode_tokens_per_s": math.nan}, {"max_num_seqs": 0}],
)
def test_invalid_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        TimingModel(**kwargs)  # type: ignore[arg-type]


async def test_requests_beyond_max_num_seqs_wait_their_turn_in_arrival_order() -> None:
    # Each request decodes 4 tokens at 200 tokens/s: 20 ms.
    engine = Engine(
        timing=TimingModel(prefill_tokens_per_s=0, decode_tokens_per_s=200, max_num_seqs=2)
    )
    loop = asyncio.get_running_loop()
    started: dict[int, float] = {}
    finished: dict[int, float] = {}

    async def request(index: int) -> None:
        async with engine.run(GenerationRequest([index] * 8, 4)) as generation:
            started[index] = loop.time()
            await generation.text()
        finished[index] = loop.time()

    tasks = [asyncio.create_task(request(index)) for index in range(4)]
    # One turn of the loop: each request has arrived (the tasks run before this one
    # resumes) and none can have finished (a decode step is a timer, and timers are looked
    # at only on the next turn), however slow the machine.
    await asyncio.sleep(0)
    assert (engine.stats.running, engine.stats.waiting) == (2, 2)
    assert sorted(started) == [0, 1]
    await asyncio.gather(*tasks)
    assert (engine.stats.running, engine.stats.waiting) == (0, 0)
    assert list(started) == [0, 1, 2, 3]
    assert started[2] >= min(finished[0], finished[1])
    assert started[3] >= max(finished[0], finished[1])
    assert max(finished.values()) - min(started.values()) >= 0.04


async def test_prefills_run_one_at_a_time_and_cached_tokens_are_free() -> None:
    # 200 uncached tokens at 10,000 tokens/s: 20 ms each, one after another.
    engine = Engine(
        block_size=4,
        timing=TimingModel(prefill_tokens_per_s=10_000, decode_tokens_per_s=0),
    )
    loop = asyncio.get_running_loop()
    begin = loop.time()
    done: list[float] = []

    async def request(prompt: list[int]) -> None:
        async with engine.run(GenerationRequest(prompt, 1)) as generation:
            await generation.text()
        done.append(loop.time() - begin)

    await asyncio.gather(*(request([k] * 200) for k in range(3)))
    assert done == sorted(done)
    assert done[0] >= 0.02 and done[1] >= 0.04 and done[2] >= 0.06
    # Repeating the first prompt: 196 of 200 tokens cached, 0.4 ms of prefill.
    again = loop.time()
    await request([0] * 200)
    assert loop.time() - again < 0.015
