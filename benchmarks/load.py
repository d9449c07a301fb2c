"""The clients of benchmarks/sidebyside.py: wrk, a first-event client, an open-loop generator.

wrk is closed-loop (each connection sends when its reply is read), which hides a slow
server behind fewer requests. The open-loop generator sends at a fixed rate whatever the
replies, on raw asyncio connections (uvloop), and times each request from when it was
due, not from when it went out.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import uvloop

HERE = Path(__file__).resolve().parent
JSON_MODEL, SSE_MODEL = "bench-json", "bench-sse"
P99_LIMIT_MS = 25.0


def request_body(model: str, *, stream: bool) -> bytes:
    body: dict[str, object] = {
        "model": model,
        "max_tokens": 16,
        "messages": [
            {"role": "system", "content": "You are a terse assistant for the benchmark. " * 6},
            {"role": "user", "content": "Say something short."},
        ],
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return orjson.dumps(body)


@dataclass
class Target:
    name: str
    base: str  # http://host:port
    key: str
    json_model: str = JSON_MODEL
    sse_model: str = SSE_MODEL
    json_base: str | None = None  # direct: the JSON and SSE upstreams are two servers

    def url(self, *, stream: bool) -> str:
        base = self.base if stream or self.json_base is None else self.json_base
        return base + "/v1/chat/completions"


@dataclass
class Figures:
    p50_ms: float
    p99_ms: float
    rps: float
    ok: int
    errors: int
    note: str = ""


def wrk(target: Target, tmp: Path, *, stream: bool, concurrency: int, seconds: int) -> Figures:
    """Closed loop: `concurrency` connections, each sending as soon as its reply is read."""
    body = tmp / f"body-{target.name}-{stream}.json"
    body.write_bytes(request_body(target.sse_model if stream else target.json_model, stream=stream))
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--latency", "--timeout", "10s"]
    command += ["-s", str(HERE / "wrk" / "post.lua"), target.url(stream=stream)]
    env = os.environ | {"BODY_FILE": str(body), "API_KEY": target.key}
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("SIDEBYSIDE "))
    data = json.loads(line.split(" ", 1)[1])
    errors = data["connect"] + data["read"] + data["write"] + data["status"] + data["timeout"]
    if not data["requests"]:
        return Figures(float("nan"), float("nan"), 0.0, 0, errors, "no reply in time")
    ok = data["requests"] - data["status"]
    return Figures(
        data["p50_us"] / 1000,
        data["p99_us"] / 1000,
        data["requests"] / (data["duration_us"] / 1e6),
        ok,
        errors,
    )


async def first_event(target: Target, seconds: float) -> Figures:
    """Time to the first `data:` line of a stream, one request at a time."""
    payload = request_body(target.sse_model, stream=True)
    headers = {"Authorization": f"Bearer {target.key}", "Content-Type": "application/json"}
    times: list[float] = []
    errors = 0
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            start = time.perf_counter()
            first, done = None, False
            async with session.post(target.url(stream=True), data=payload, headers=headers) as r:
                async for line in r.content:
                    if first is None and line.startswith(b"data:"):
                        first = time.perf_counter() - start
                    done = done or line.startswith(b"data: [DONE]")
                if r.status == 200 and first is not None and done:
                    times.append(first)
                else:
                    errors += 1
        elapsed = time.perf_counter() - started
    return summarise(times, elapsed, errors)


def summarise(times: list[float], seconds: float, errors: int, note: str = "") -> Figures:
    if not times:
        return Figures(float("nan"), float("nan"), 0.0, 0, errors, note)
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    p50 = statistics.median(ordered)
    return Figures(p50 * 1000, p99 * 1000, len(times) / seconds, len(times), errors, note)


class Exchange(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the open-loop generator: one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.reply: asyncio.Future[int] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes) -> asyncio.Future[int]:
        self.reply = asyncio.get_running_loop().create_future()
        self.buffer = b""
        assert self.transport is not None
        self.transport.write(request)
        return self.reply

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.reply is None or self.reply.done():
            return
        head = self.buffer[:end].lower()
        at = head.find(b"content-length:")
        if at >= 0:
            line_end = head.find(b"\r\n", at)
            length = int(head[at + 15 : line_end if line_end >= 0 else len(head)])
            complete = len(self.buffer) - end - 4 >= length
        else:  # chunked
            complete = self.buffer.endswith(b"\r\n0\r\n\r\n")
        if complete:
            if b"connection: close" in head:
                self.closed = True
            self.reply.set_result(int(self.buffer[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(0)


async def open_loop(target: Target, rate: float, seconds: float) -> tuple[Figures, float]:
    """Send at `rate` per second whatever the replies; latency from the planned send time.

    Stops sending early once more than 1% of the step has failed (the step is lost
    anyway, and a queue of unanswered requests would spill into the next step).
    Returns the figures and this generator's own CPU share of its core.
    """
    host, port = target.url(stream=False).split("//")[1].split("/")[0].split(":")
    path = "/v1/chat/completions"
    body = request_body(target.json_model, stream=False)
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {target.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    loop = asyncio.get_running_loop()
    idle: list[Exchange] = []
    every: list[Exchange] = []
    total = max(1, int(rate * seconds))
    budget = max(1, total // 100)  # p99 under the limit allows this many slow or failed
    times: list[float] = []
    failed = 0

    async def connection() -> Exchange:
        _, exchange = await loop.create_connection(Exchange, host, int(port))
        every.append(exchange)
        return exchange

    async def one(planned: float) -> None:
        nonlocal failed
        exchange = idle.pop() if idle else await connection()
        try:
            status = await asyncio.wait_for(exchange.send(request), 5.0)
        except TimeoutError:
            status = 0
        latency = time.perf_counter() - planned
        if status == 200:
            times.append(latency)
            if latency * 1000 > P99_LIMIT_MS:
                failed += 1
        else:
            failed += 1
        if status and not exchange.closed:
            idle.append(exchange)

    idle += await asyncio.gather(*(connection() for _ in range(min(64, total))))
    cpu, started = time.process_time(), time.perf_counter()
    tasks: list[asyncio.Future[None]] = []
    for i in range(total):
        planned = started + i / rate
        delay = planned - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if failed > budget or len(tasks) - len(times) > 2000:
            break
        tasks.append(asyncio.ensure_future(one(planned)))
    await asyncio.wait(tasks, timeout=5.0)
    elapsed = time.perf_counter() - started
    cpu_share = (time.process_time() - cpu) / elapsed
    for exchange in every:
        if exchange.transport is not None:
            exchange.transport.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    unsent = total - len(tasks)
    # p50/p99 of the 200s; a step is held only when there are no errors (a request
    # unsent, unanswered or not 200), so their p99 is then the whole step's.
    figures = summarise(times, elapsed, total - len(times), f"{unsent} unsent" if unsent else "")
    figures.rps = rate
    return figures, cpu_share


def sweep(target: Target, step_s: float, start: float, most: float) -> tuple[Figures, float, int]:
    """Double the rate until p99 passes the limit, then halve the gap three times.

    A rate is held when every request of a step was answered 200 and their p99 (from
    the planned send time) is under the limit, in one of two tries.

    Returns the highest rate held (its figures; rps 0 when even `start` was not held),
    the generator's CPU share at that rate, and the 200s seen over all steps.
    """
    held: tuple[Figures, float] | None = None
    tried: list[tuple[Figures, float]] = []
    seen = 0

    def step(rate: float) -> bool:
        nonlocal held, seen
        for _ in range(2):  # a failed step is tried again: a stall of the machine is no limit
            figures, cpu = uvloop.run(open_loop(target, rate, step_s))
            tried.append((figures, cpu))
            seen += figures.ok
            if figures.errors == 0 and figures.p99_ms <= P99_LIMIT_MS:
                held = (figures, cpu)
                time.sleep(0.5)
                return True
            time.sleep(3.0)  # an overrun leaves a queue behind: let the target drain it
        return False

    rate, failed_at = min(start, most), None
    while True:
        if not step(rate):
            failed_at = rate
            break
        if rate >= most:
            break
        rate = min(rate * 2, most)
    if held is not None and failed_at is not None:
        low, high = held[0].rps, failed_at
        for _ in range(3):
            middle = round((low + high) / 2)
            low, high = (middle, high) if step(middle) else (low, middle)
    if held is None:  # not even the first rate: its figures, with no rate held
        figures, cpu = tried[-1]
        said = f"no rate held: p50/p99 shown are of the 200s at {figures.rps:.0f}/s"
        figures.note = ", ".join(filter(None, [said, figures.note]))
        figures.rps = 0.0
        return figures, cpu, seen
    figures, cpu = held
    if failed_at is None:
        figures.note = f"capped at {most:.0f}/s"
    return figures, cpu, seen
