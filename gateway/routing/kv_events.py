"""One replica's KV event stream, kept complete: a ZMQ SUB consumer with gap recovery.

The consumer applies every batch to a `KvEventSink` exactly once and in order, and says
(``on_fresh``) whether its view of the replica can be trusted right now:

- in order (``seq == next``): applied;
- a gap (``seq > next``: messages dropped by ZMQ or the network): the missing batches are
  asked for on the replica's replay socket and applied first; when the replica no longer
  has them (its buffer moved on), the view is resynchronised: cleared, then rebuilt from
  what follows, so it may miss old blocks but never claims a block the replica dropped;
- an old number: a duplicate already applied (the same payload) is skipped; anything else
  means the publisher restarted (a new vLLM process numbers from 0 with an empty cache),
  so the view is cleared and the new process's history is replayed from 0.

The stream can also stop: the publisher dies, or drops the last messages of a burst with
nothing after them to reveal the gap. ZMQ's socket monitor reports the connection going
down (the view goes stale at once and routing falls back to the approximate index), and
while the stream is idle the consumer probes the replay socket every ``probe_interval_s``
asking for everything from the last batch it applied: an answer with more batches fills
the gap; the last batch not being there, or changed, reveals a restart; no answer within
``replay_timeout_s`` marks the view stale. Without a replay socket, a gap resynchronises
and a live connection is what ``fresh`` means.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import xxhash
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.routing.fleet_config import KvEventSource
from gateway.routing.index import KvEventSink
from gateway.routing.kv_wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    WireError,
    decode_batch,
    read_seq,
    seq_bytes,
)

log = logging.getLogger("kvgate.kv_events")

# Sequence numbers of recently applied batches, to tell a duplicate from a restart.
_RECENT = 4096
_MONITORED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


@dataclass(slots=True)
class ConsumerStats:
    """What happened to the stream, for metrics and tests."""

    batches: int = 0  # applied, live or replayed
    gaps: int = 0  # missing batches noticed
    replayed: int = 0  # batches recovered through the replay socket
    resyncs: int = 0  # history lost: view cleared and rebuilt
    restarts: int = 0  # publisher restarted: view cleared
    stale: int = 0  # times the view went stale


class KvEventConsumer:
    """Subscribes to one replica's KV events and keeps a sink in step with its cache."""

    def __init__(
        self,
        source: KvEventSource,
        sink: KvEventSink,
        *,
        on_fresh: Callable[[str, bool], None] | None = None,
        context: zmq.asyncio.Context | None = None,
        probe_interval_s: float = 1.0,
        replay_timeout_s: float = 1.0,
    ) -> None:
        self.source = source
        self.sink = sink
        self.stats = ConsumerStats()
        self.next_seq: int | None = None
        self.fresh = False
        self._on_fresh = on_fresh
        self._own_context = context is None
        self._context = context if context is not None else zmq.asyncio.Context()
        self._probe_ms = max(1, int(probe_interval_s * 1000))
        self._replay_timeout_ms = max(1, int(replay_timeout_s * 1000))
        self._recent: OrderedDict[int, int] = OrderedDict()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    # -- life ------------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Run on the current loop until `stop`."""
        if self._task is None:
            self._task = asyncio.ensure_future(self.run())
        return self._task

    async def stop(self) -> None:
        """Stop consuming, and destroy the ZMQ context if it is this consumer's own."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._own_context:
            self._context.destroy(linger=0)

    async def run(self) -> None:
        """Consume forever: subscribe, catch up, apply, probe, recover."""
        source = self.source
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, source.topic.encode())
        monitor = sub.get_monitor_socket(_MONITORED)
        if _binds(source.endpoint):
            sub.bind(source.endpoint)
        else:
            sub.connect(source.endpoint)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            if source.replay_endpoint is not None:
                await self.catch_up()
            while True:
                ready = dict(await poller.poll(self._probe_ms))
                if monitor in ready:
                    await self._connection(await monitor.recv_multipart())
                if sub in ready:
                    await self._drain(sub)
                elif not ready and source.replay_endpoint is not None:
                    await self.catch_up()
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            self._set_fresh(False)

    # -- the stream --------------------------------------------------------------------------

    async def catch_up(self) -> bool:
        """Ask the replay socket for everything since the last batch applied; apply it.

        Returns whether the view is now complete; on no answer it is marked stale.
        """
        if self.source.replay_endpoint is None:
            return self.fresh
        async with self._lock:
            anchor = max(0, self.next_seq - 1) if self.next_seq is not None else 0
            batches = await self._replay(anchor)
            if batches is None:
                self._set_fresh(False)
                return False
            # The batch we applied last must come back unchanged; if it does not, the
            # replica's buffer moved past it, or this is a new process numbering from 0.
            applied = self.next_seq is not None and self.next_seq > 0
            if applied and not (batches and batches[0][0] == anchor and self._seen(*batches[0])):
                if batches and batches[0][0] > anchor:
                    self._resync("the replica's replay buffer moved past our last batch")
                else:
                    self._restarted()
                    batches = await self._replay(0)
                    if batches is None:
                        self._set_fresh(False)
                        return False
            for seq, payload in batches:
                self._take(seq, payload, replayed=True)
            self._set_fresh(True)
            return True

    async def _drain(self, sub: zmq.asyncio.Socket) -> None:
        while True:
            try:
                frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:
                log.warning("%s: KV event message of %d frames", self.source.replica, len(frames))
                continue
            try:
                seq = read_seq(frames[1])
            except WireError as exc:
                log.warning("%s: %s", self.source.replica, exc)
                continue
            await self._receive(seq, frames[2])

    async def _receive(self, seq: int, payload: bytes) -> None:
        expected = self.next_seq
        if expected is None or seq == expected:
            self._take(seq, payload, replayed=False)
            if expected is None:
                self._set_fresh(True)
            return
        if seq > expected:
            self.stats.gaps += 1
            log.info("%s: KV events %d..%d missing", self.source.replica, expected, seq - 1)
            if self.source.replay_endpoint is not None and await self.catch_up():
                if self.next_seq is not None and seq >= self.next_seq:
                    self._take(seq, payload, replayed=False)
                return
            self._take(seq, payload, replayed=False)  # unrecoverable: resynchronises
            return
        if self._seen(seq, payload):
            return  # already applied (it came by replay first)
        self._restarted()
        if self.source.replay_endpoint is not None and await self.catch_up():
            return
        self._take(seq, payload, replayed=False)

    async def _connection(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        if event == zmq.EVENT_DISCONNECTED:
            log.warning("%s: KV event publisher disconnected", self.source.replica)
            self._set_fresh(False)
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            # A reconnect may be to a new process: the replay check tells, and catches up.
            if self.source.replay_endpoint is not None:
                await self.catch_up()
            else:
                self._set_fresh(True)

    # -- applying ------------------------------------------------------------------------

    def _take(self, seq: int, payload: bytes, *, replayed: bool) -> None:
        if self.next_seq is not None and seq < self.next_seq:
            return
        if self.next_seq is not None and seq > self.next_seq:
            self._resync(f"events {self.next_seq}..{seq - 1} are gone for good")
        try:
            batch = decode_batch(payload)
        except WireError as exc:
            log.warning("%s: undecodable KV event batch %d: %s", self.source.replica, seq, exc)
            batch = None
        replica = self.source.replica
        sink = self.sink
        for event in batch.events if batch is not None else ():
            if isinstance(event, BlockStored):
                sink.block_stored(replica, event.block_hashes, medium=event.medium)
            elif isinstance(event, BlockRemoved):
                sink.block_removed(replica, event.block_hashes, medium=event.medium)
            elif isinstance(event, AllBlocksCleared):
                sink.all_blocks_cleared(replica)
        self.next_seq = seq + 1
        self.stats.batches += 1
        if replayed:
            self.stats.replayed += 1
        recent = self._recent
        recent[seq] = xxhash.xxh3_64_intdigest(payload)
        if len(recent) > _RECENT:
            recent.popitem(last=False)

    def _seen(self, seq: int, payload: bytes) -> bool:
        return self._recent.get(seq) == xxhash.xxh3_64_intdigest(payload)

    def _restarted(self) -> None:
        log.warning("%s: KV event publisher restarted; its cache starts empty", self.source.replica)
        self.stats.restarts += 1
        self.sink.all_blocks_cleared(self.source.replica)
        self.next_seq = 0
        self._recent.clear()

    def _resync(self, why: str) -> None:
        log.warning("%s: resynchronising the exact view: %s", self.source.replica, why)
        self.stats.resyncs += 1
        self.sink.all_blocks_cleared(self.source.replica)
        self._recent.clear()

    def _set_fresh(self, fresh: bool) -> None:
        if fresh == self.fresh:
            return
        self.fresh = fresh
        if not fresh:
            self.stats.stale += 1
        if self._on_fresh is not None:
            self._on_fresh(self.source.replica, fresh)

    # -- replay ------------------------------------------------------------------------------

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Every buffered batch from ``start``, or None when the replica does not answer."""
        assert self.source.replay_endpoint is not None
        dealer = self._context.socket(zmq.DEALER)
        dealer.connect(self.source.replay_endpoint)
        timeout = self._replay_timeout_ms
        out: list[tuple[int, bytes]] = []
        try:
            try:
                await dealer.send_multipart((b"", seq_bytes(start)), flags=zmq.NOBLOCK)
            except zmq.Again:
                return None
            while True:
                if not await dealer.poll(timeout):
                    return None
                frames = await dealer.recv_multipart()
                if len(frames) != 4:
                    return None
                _, _, raw_seq, payload = frames
                if raw_seq == END_SEQ:
                    return out
                out.append((read_seq(raw_seq), payload))
        finally:
            dealer.close(linger=0)


def _binds(endpoint: str) -> bool:
    """A wildcard endpoint means the replica connects to us (vLLM's rule, mirrored)."""
    return "*" in endpoint or "::" in endpoint
