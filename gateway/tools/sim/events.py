"""KV events from the simulated replica, in vLLM's wire format and with vLLM's replay socket.

What the engine does to its prefix cache becomes one event batch per engine operation
(an admission, a finished request's output blocks, a reset): evictions first, as
``BlockRemoved``, then the newly cached blocks as ``BlockStored`` (one event per run of
consecutive blocks, with the parent hash, token ids and the salt as extra key of a first
block), or ``AllBlocksCleared``. With lower tiers, what moves between them comes between
the two, in order, with vLLM's media: GPU memory's evictions stored in ``CPU``, the
host's evictions removed from ``CPU`` and stored in ``STORAGE``, a hit loaded back
removed from its tier and stored in ``GPU`` again (offloaded blocks' events carry only
their hashes, as vLLM's offloading connector's do unless self-describing). Batches are
numbered from 0 per process, published on a PUB socket and kept (the last
``buffer_steps``) for replay over a ROUTER socket, exactly as vLLM's
``ZmqEventPublisher`` does, so a gateway cannot tell a simulator from vLLM.

Endpoints follow vLLM's rule: an address with ``*`` (or ``::``), ``ipc://`` or
``inproc://`` is bound, any other is connected to; the replay endpoint is always bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from gateway.routing.kv_wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    encode_batch,
    seq_bytes,
)
from gateway.routing.tiers import GPU, MEDIA
from gateway.routing.vllm_blocks import external
from gateway.tools.sim.cache import Admission

log = logging.getLogger("kvgate.sim.events")


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """vLLM's ``--kv-events-config`` fields that the simulator honours."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000
    hwm: int = 100_000


def binds(endpoint: str) -> bool:
    """vLLM binds wildcard and ipc/inproc endpoints and connects to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class EventPublisher:
    """A PUB socket, a replay buffer and a ROUTER socket answering replay requests."""

    def __init__(self, config: KvEventsConfig) -> None:
        self.config = config
        self._topic = config.topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        if binds(config.endpoint):
            self._pub.bind(config.endpoint)
        else:
            self._pub.connect(config.endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        if config.replay_endpoint is not None:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.bind(config.replay_endpoint)
        self._task: asyncio.Task[None] | None = None

    @property
    def published(self) -> int:
        """Batches published so far (the next batch's sequence number)."""
        return self._seq

    def start(self) -> None:
        """Serve replay requests on the running loop."""
        if self._replay is not None and self._task is None:
            self._task = asyncio.ensure_future(self._serve_replay())

    async def close(self) -> None:
        """Stop the replay task, close both sockets and end the ZMQ context."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._context.term()

    def publish(self, events: Sequence[Event]) -> None:
        """One batch, numbered and kept for replay; nothing when there is nothing to say."""
        if not events:
            return
        batch = EventBatch(ts=time.time(), events=tuple(events), data_parallel_rank=0)
        payload = encode_batch(batch)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            # PUB never blocks: past the high-water mark ZMQ drops, as vLLM's would.
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        replay = self._replay
        while True:
            frames = await replay.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await replay.send_multipart((client, b"", self._topic, seq_bytes(seq), payload))
            await replay.send_multipart((client, b"", b"", END_SEQ, b""))


class CacheEvents:
    """Turns what the engine did to its cache into event batches for a publisher."""

    def __init__(self, publisher: EventPublisher, block_size: int) -> None:
        self.publisher = publisher
        self.block_size = block_size

    def admitted(
        self,
        admission: Admission,
        chain: Sequence[Hashable],
        token_ids: Sequence[int],
        cache_salt: str | None,
    ) -> None:
        """Evictions, then the runs of newly stored blocks, as one batch."""
        events: list[Event] = []
        if admission.evicted:
            events.append(BlockRemoved(_keys(admission.evicted), medium=GPU))
        events.extend(_moves(admission.moves))
        stored = set(admission.stored)
        run: list[int] = []
        for index, block in enumerate(chain):
            if block in stored:
                run.append(index)
                continue
            if run:
                events.append(self._stored(run, chain, token_ids, cache_salt))
                run = []
        if run:
            events.append(self._stored(run, chain, token_ids, cache_salt))
        self.publisher.publish(events)

    def cleared(
        self,
        dropped: Sequence[Hashable],
        *,
        everything: bool,
        lower: Sequence[Sequence[Hashable]] = (),
    ) -> None:
        """A reset: vLLM resets only an idle cache and says AllBlocksCleared; blocks that
        running requests still pin here stay, so then the dropped ones are named (and
        the lower tiers' blocks, ``lower``, each tier's apart)."""
        if everything:
            self.publisher.publish([AllBlocksCleared()])
            return
        events: list[Event] = []
        if dropped:
            events.append(BlockRemoved(_keys(dropped), medium=GPU))
        for tier, blocks in enumerate(lower, 1):
            if blocks:
                events.append(BlockRemoved(_keys(blocks), medium=MEDIA[tier]))
        self.publisher.publish(events)

    def _stored(
        self,
        run: list[int],
        chain: Sequence[Hashable],
        token_ids: Sequence[int],
        cache_salt: str | None,
    ) -> BlockStored:
        size = self.block_size
        first, last = run[0], run[-1]
        return BlockStored(
            block_hashes=_keys([chain[i] for i in run]),
            parent_block_hash=_key(chain[first - 1]) if first else None,
            token_ids=tuple(token_ids[first * size : (last + 1) * size]),
            block_size=size,
            medium=GPU,
            extra_keys=tuple((cache_salt,) if i == 0 and cache_salt else None for i in run),
        )


def _moves(moves: Sequence[tuple[int, bool, Hashable]]) -> list[Event]:
    """Lower tiers' changes as events, consecutive ones of a kind and tier together."""
    events: list[Event] = []
    run: list[Hashable] = []
    kind: tuple[int, bool] | None = None
    for tier, stored, block in (*moves, (0, False, None)):
        if (tier, stored) != kind:
            if kind is not None and run:
                medium = MEDIA[kind[0]]
                keys = _keys(run)
                events.append(
                    BlockStored(keys, medium=medium) if kind[1] else BlockRemoved(keys, medium)
                )
            kind, run = (tier, stored), []
        run.append(block)
    return events


def _key(block: Hashable) -> int:
    if not isinstance(block, bytes):
        raise TypeError("the simulator's blocks are sha256 digests")
    return external(block)


def _keys(blocks: Sequence[Hashable]) -> tuple[int, ...]:
    return tuple(_key(b) for b in blocks)
