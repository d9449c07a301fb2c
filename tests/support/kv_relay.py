"""A lossy hop between a KV event publisher and a consumer, for tests of gap recovery.

It subscribes to the publisher and republishes every message unchanged on its own PUB
endpoint, except while ``dropping`` is set: then messages are counted and thrown away,
as a congested network or a ZMQ high-water mark would. The replay socket is not relayed:
the consumer reaches the publisher's directly, as it would in production.
"""

from __future__ import annotations

import asyncio
import contextlib

import zmq
import zmq.asyncio


class LossyRelay:
    """SUB from ``upstream``, PUB on ``endpoint`` (bound), dropping on demand."""

    def __init__(self, upstream: str, endpoint: str) -> None:
        self.upstream = upstream
        self.endpoint = endpoint
        self.dropping = False
        self.dropped = 0
        self.forwarded = 0
        self.last_seq = -1  # of the last message seen, dropped or not
        self._context = zmq.asyncio.Context()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LossyRelay:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.upstream)
        pub = self._context.socket(zmq.PUB)
        pub.bind(self.endpoint)
        self._task = asyncio.ensure_future(self._relay(sub, pub))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._context.destroy(linger=0)

    async def _relay(self, sub: zmq.asyncio.Socket, pub: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sub.recv_multipart()
            self.last_seq = int.from_bytes(frames[1], "big", signed=True)
            if self.dropping:
                self.dropped += 1
            else:
                self.forwarded += 1
                await pub.send_multipart(frames)
