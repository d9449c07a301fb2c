"""Steady client traffic from a thread of its own, and what the clients saw.

Plain aiohttp rather than the openai SDK: the soak runs for half an hour on a two-core
machine next to the gateway, three replicas and Postgres, so the clients must cost little.
A request counts as completed when the client saw it whole: a 200 with its JSON body, or a
stream that ended with ``[DONE]`` (the gateway sends that only once the record is durable).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

DONE = b"data: [DONE]\n\n"


@dataclass
class Tally:
    """What the clients saw."""

    completed: list[str] = field(default_factory=list)  # request ids, in completion order
    completed_at: list[float] = field(default_factory=list)  # monotonic times, same order
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)  # broken streams, exceptions
    refusals: list[bytes] = field(default_factory=list)  # distinct bodies of 503s
    broken: dict[str, bytes] = field(default_factory=dict)  # streams without [DONE], by id
    streams: int = 0

    def completed_between(self, start: float, end: float) -> int:
        return sum(1 for at in self.completed_at if start <= at < end)


class Load:
    """Mixed streaming and plain chat requests at a steady rate, until stopped."""

    def __init__(
        self,
        base_url: str,
        key: str,
        model: str,
        *,
        rate: float,
        concurrency: int = 32,
        max_tokens: int = 4,
        stream_every: int = 2,
        timeout_s: float = 60.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        self.model = model
        self.interval = 1.0 / rate
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.stream_every = stream_every
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.tally = Tally()
        self._sent = 0
        self._next_at = 0.0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name="kvgate-test-load", daemon=True)

    @property
    def completed(self) -> int:
        return len(self.tally.completed)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> Tally:
        """Stop sending; wait for the requests in flight; what the clients saw."""
        self._stopping.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the load did not stop"
        return self.tally

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.concurrency, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=self.timeout) as session:
            self._next_at = time.monotonic()
            await asyncio.gather(*(self._worker(session) for _ in range(self.concurrency)))

    async def _worker(self, session: aiohttp.ClientSession) -> None:
        while not self._stopping.is_set():
            now = time.monotonic()
            at = self._next_at = max(self._next_at + self.interval, now)
            if at > now:
                await asyncio.sleep(at - now)
            if self._stopping.is_set():
                return
            self._sent += 1
            await self._one(session, self._sent)

    async def _one(self, session: aiohttp.ClientSession, n: int) -> None:
        stream = self.stream_every > 0 and n % self.stream_every == 0
        body: dict[str, object] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": [{"role": "user", "content": f"load request {n}: tell me about {n % 97}"}],
        }
        if stream:
            body["stream"] = True
        tally, started = self.tally, time.monotonic()
        try:
            async with session.post(self.url, json=body, headers=self.headers) as reply:
                data = await reply.read()
                tally.statuses[reply.status] += 1
                if reply.status == 503 and data not in tally.refusals:
                    tally.refusals.append(data)
                if reply.status != 200:
                    return
                request_id = reply.headers["x-request-id"]
                if stream and not data.endswith(DONE):
                    tally.errors.append(f"stream without [DONE]: {data[-300:]!r}")
                    if len(tally.broken) < 1000:
                        tally.broken[request_id] = data
                    return
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.errors.append(repr(exc))
            return
        ended = time.monotonic()
        tally.streams += stream
        tally.completed.append(request_id)
        tally.completed_at.append(ended)
        tally.latencies.append(ended - started)
