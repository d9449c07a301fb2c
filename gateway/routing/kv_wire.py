"""vLLM's KV event wire format (vLLM 0.32, ``vllm/distributed/kv_events.py``), both ways.

One ZMQ PUB message per engine step, multipart::

    [topic, seq (int64 big-endian, from 0 per publisher process), payload]
    payload = msgpack [ts (float), [event, ...], data_parallel_rank]   (rank may be absent)

Events are msgpack maps tagged by ``type`` (msgspec's tagged structs), fields at their
default left out: ``BlockStored`` {block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium, lora_name, extra_keys (one entry per block: ``[salt]`` on a salted first
block, else None), group_idx, kv_cache_spec_kind, ...}, ``BlockRemoved`` {block_hashes,
medium, group_idx}, ``AllBlocksCleared`` {}. Block hashes are ints (the low 64 bits of the
digest) unless the replica runs with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 (raw bytes).

Replay (ROUTER on the replica, DEALER here): send ``[b"", start_seq (8 bytes big-endian)]``;
the answer is ``[b"", topic, seq, payload]`` for every buffered batch with seq ≥ start,
then ``[b"", b"", END_SEQ, b""]`` with END_SEQ = -1 as a signed int64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack  # type: ignore[import-untyped]

from gateway.routing.vllm_blocks import external

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"


class WireError(ValueError):
    """A message that is not vLLM's KV event format."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    medium: str | None = None
    # One entry per block: the untagged extra keys ([salt] on a salted first block).
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[Event, ...] = field(default_factory=tuple)
    data_parallel_rank: int | None = None


def seq_bytes(seq: int) -> bytes:
    """A sequence number as its frame: 8 bytes, big-endian, signed."""
    return seq.to_bytes(8, "big", signed=True)


def read_seq(raw: bytes) -> int:
    """The sequence number a frame holds; WireError unless it is 8 bytes."""
    if len(raw) != 8:
        raise WireError(f"sequence frame of {len(raw)} bytes, expected 8")
    return int.from_bytes(raw, "big", signed=True)


def encode_batch(batch: EventBatch) -> bytes:
    """A payload exactly as vLLM's msgspec encoder writes it."""
    events = [_encode_event(e) for e in batch.events]
    body: list[Any] = [batch.ts, events]
    if batch.data_parallel_rank is not None:
        body.append(batch.data_parallel_rank)
    return bytes(msgpack.packb(body, use_bin_type=True))


def decode_batch(payload: bytes) -> EventBatch:
    """A payload back into events; unknown event types are skipped (newer vLLMs)."""
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData) as exc:
        raise WireError(f"payload is not msgpack: {exc}") from None
    if not isinstance(body, list) or len(body) < 2 or not isinstance(body[1], list):
        raise WireError("payload is not [ts, [events], dp_rank]")
    events = tuple(e for e in map(_decode_event, body[1]) if e is not None)
    rank = body[2] if len(body) > 2 else None
    return EventBatch(ts=float(body[0]), events=events, data_parallel_rank=rank)


def _encode_event(event: Event) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        out: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium,
            "lora_name": None,
        }
        if event.extra_keys is not None:
            out["extra_keys"] = [None if k is None else list(k) for k in event.extra_keys]
        out["group_idx"] = 0
        out["kv_cache_spec_kind"] = "full_attention"
        return out
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": list(event.block_hashes),
            "medium": event.medium,
            "group_idx": 0,
        }
    return {"type": "AllBlocksCleared"}


def _decode_event(raw: Any) -> Event | None:
    if not isinstance(raw, dict):
        raise WireError("an event is not a map")
    kind = raw.get("type")
    if kind == "BlockStored":
        extra = raw.get("extra_keys")
        return BlockStored(
            block_hashes=_hashes(raw.get("block_hashes")),
            parent_block_hash=_hash(raw["parent_block_hash"])
            if raw.get("parent_block_hash") is not None
            else None,
            token_ids=tuple(raw.get("token_ids") or ()),
            block_size=int(raw.get("block_size") or 0),
            medium=raw.get("medium"),
            extra_keys=None if extra is None else tuple(_keys(k) for k in extra),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(block_hashes=_hashes(raw.get("block_hashes")), medium=raw.get("medium"))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _hash(value: Any) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, bytes):
        return external(value)
    raise WireError(f"a block hash of type {type(value).__name__}")


def _hashes(values: Sequence[Any] | None) -> tuple[int, ...]:
    return tuple(_hash(v) for v in values or ())


def _keys(value: Any) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)
