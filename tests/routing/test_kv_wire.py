"""KV event payloads byte for byte as vLLM 0.32 writes them (msgspec's msgpack encoder)."""

from __future__ import annotations

import msgpack
import pytest

from gateway.routing.kv_wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    WireError,
    decode_batch,
    encode_batch,
    read_seq,
    seq_bytes,
)

# vllm.distributed.kv_events.KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[1, 2],
# parent_block_hash=None, token_ids=[5, 6, 7, 8], block_size=2, lora_id=None, medium="GPU",
# lora_name=None, extra_keys=[("s",), None], group_idx=0, kv_cache_spec_kind="full_attention"),
# BlockStored([3], parent 2, [9, 10], ..., extra_keys=[None]), BlockRemoved([1], "GPU", 0),
# AllBlocksCleared()], data_parallel_rank=0), encoded by msgspec.msgpack.Encoder() in vLLM 0.32.
VLLM_PAYLOAD = bytes.fromhex(
    "93cb3ff8000000000000948ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392"
    "0102b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739405060708aa626c6f636b5f"
    "73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f"
    "6b6579739291a173c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c"
    "6c5f617474656e74696f6e8ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391"
    "03b1706172656e745f626c6f636b5f6861736802a9746f6b656e5f69647392090aaa626c6f636b5f73697a"
    "6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579"
    "7391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f61747465"
    "6e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739101a66d6564"
    "69756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"
)
BATCH = EventBatch(
    ts=1.5,
    events=(
        BlockStored((1, 2), None, (5, 6, 7, 8), 2, "GPU", (("s",), None)),
        BlockStored((3,), 2, (9, 10), 2, "GPU", (None,)),
        BlockRemoved((1,), "GPU"),
        AllBlocksCleared(),
    ),
    data_parallel_rank=0,
)


def test_encoding_is_byte_identical_to_vllms() -> None:
    assert encode_batch(BATCH) == VLLM_PAYLOAD


def test_decoding_vllms_payload_gives_the_events_back() -> None:
    assert decode_batch(VLLM_PAYLOAD) == BATCH


def test_raw_byte_hashes_are_named_by_their_low_64_bits_and_unknown_events_skipped() -> None:
    digest = bytes(range(32))
    payload = msgpack.packb(
        [
            2.0,
            [
                {"type": "BlockRemoved", "block_hashes": [digest], "medium": "CPU"},
                {"type": "SomethingNewer", "x": 1},
            ],
        ]
    )
    batch = decode_batch(payload)
    assert batch == EventBatch(2.0, (BlockRemoved((0x18191A1B1C1D1E1F,), "CPU"),), None)


def test_sequence_numbers_are_signed_64_bit_big_endian() -> None:
    assert seq_bytes(1) == b"\x00" * 7 + b"\x01"
    assert read_seq(b"\xff" * 8) == -1
    with pytest.raises(WireError):
        read_seq(b"\x01")
    with pytest.raises(WireError):
        decode_batch(msgpack.packb({"not": "a batch"}))
