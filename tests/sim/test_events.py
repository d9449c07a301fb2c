"""The simulator's KV events say what vLLM's say: each BlockStored's hashes are vLLM's
hashes of its own token ids, parent and salt, and batches are numbered from 0."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq
import zmq.asyncio

from gateway.routing.kv_wire import BlockStored, decode_batch, read_seq
from gateway.routing.vllm_blocks import BlockHashing, external
from gateway.tools.sim.events import KvEventsConfig
from gateway.tools.sim.server import SimConfig
from gateway.tools.sim.timing import TimingModel
from tests.sim.conftest import SimFactory

MODEL = "kvgate/demo-llama-8b"


async def test_stored_blocks_carry_tokens_parent_and_salt_that_rehash_to_their_names(
    sim: SimFactory, tmp_path: Path
) -> None:
    events = KvEventsConfig(f"ipc://{tmp_path}/pub", topic="kv")
    config = SimConfig(block_size=4, timing=TimingModel.zero(), kv_events=events)
    context = zmq.asyncio.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    try:
        async with sim(config) as s:
            sub.connect(events.endpoint)
            await asyncio.sleep(0.2)  # ZMQ's slow joiner: let the subscription arrive
            messages = [{"role": "user", "content": "a b c d e f g h i j"}]  # 12 tokens
            await s.api.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=7, extra_body={"cache_salt": "t"}
            )
            frames = [await sub.recv_multipart() for _ in range(2)]
    finally:
        context.destroy(linger=0)
    assert [(f[0], read_seq(f[1])) for f in frames] == [(b"kv", 0), (b"kv", 1)]
    prompt, output = (decode_batch(f[2]).events for f in frames)
    assert len(prompt) == 1 and isinstance(prompt[0], BlockStored)
    stored = prompt[0]
    assert (stored.parent_block_hash, stored.block_size, stored.medium) == (None, 4, "GPU")
    assert stored.extra_keys == (("t",), None, None)
    assert list(stored.block_hashes) == BlockHashing().keys(stored.token_ids, 4, "t")
    # 12 prompt + 6 fed-back output tokens: one more full block, chained to the prompt's.
    assert len(output) == 1 and isinstance(output[0], BlockStored)
    grown = output[0]
    assert grown.parent_block_hash == stored.block_hashes[-1]
    chain = BlockHashing().chain(stored.token_ids + grown.token_ids, 4, "t")
    assert grown.block_hashes == (external(chain[3]),) and grown.extra_keys == (None,)
