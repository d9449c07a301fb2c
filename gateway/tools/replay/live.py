"""Live replay: a trace's requests sent through a running gateway as real chat requests.

Each hash id becomes a fixed block of text, one common English word per token, drawn
from a generator seeded by the id: the same id always gives the same text, so requests
that share a prefix of hash ids share a prefix of text on the wire, and the replicas'
prefix caches see the reuse the trace describes. A partial last block is a prefix of its
full text. Requests leave at the trace's arrival times divided by ``speed``; hit rates
come from the responses' ``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

import aiohttp
import orjson

from gateway.tools.lcg import GOLDEN, MASK64, draws
from gateway.tools.replay.metrics import percentile
from gateway.tools.replay.trace import MOONCAKE_BLOCK_TOKENS, TraceRequest
from gateway.tools.totals import StatementTotals

# Words that common BPE vocabularies (and the simulated replica) hold as one token each.
WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with",
    "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
    "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can",
    "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
    "time", "people", "year", "way", "day", "man", "thing", "life", "world", "school",
    "state", "family", "group", "country", "problem", "hand",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LiveOutcome:
    """One request sent through the gateway, as the client saw it."""

    arrival_s: float  # when the trace says it arrives (already divided by speed)
    status: int  # HTTP status; 0 when no response came
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the request was answered 200, with no error."""
        return self.status == 200 and self.error is None


@dataclass(frozen=True, slots=True)
class LiveSummary:
    """Hit rate and latency of a live replay, from the responses' usage."""

    requests: int
    completed: int
    prompt_tokens: int
    cached_tokens: int
    token_hit_rate: float
    ttft_p50_s: float
    ttft_p99_s: float


def block_text(hash_id: int, tokens: int) -> str:
    """``tokens`` words for the block named ``hash_id``: the same id, the same words."""
    picks = draws((hash_id * GOLDEN + 1) & MASK64)
    words = [WORDS[next(picks)] for _ in range(tokens)]
    # A trailing space closes the last word, so the next block starts a new token.
    return " ".join(words) + " " if words else ""


def prompt_text(request: TraceRequest, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> str:
    """The request's prompt: its blocks' texts in order, the last one cut to length."""
    parts = []
    remaining = request.input_length
    for hash_id in request.hash_ids:
        size = min(block_tokens, remaining)
        if size <= 0:
            break
        parts.append(block_text(hash_id, size))
        remaining -= size
    return "".join(parts)


def summarize_live(outcomes: Sequence[LiveOutcome]) -> LiveSummary:
    """Token hit rate over completed requests, and their TTFT percentiles."""
    done = [o for o in outcomes if o.ok]
    prompt = sum(o.prompt_tokens for o in done)
    cached = sum(o.cached_tokens for o in done)
    ttfts = sorted(o.ttft_s for o in done if o.ttft_s is not None)
    return LiveSummary(
        requests=len(outcomes),
        completed=len(done),
        prompt_tokens=prompt,
        cached_tokens=cached,
        token_hit_rate=cached / prompt if prompt else 0.0,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
    )


async def replay_live(
    requests: Sequence[TraceRequest],
    *,
    target: str,
    key: str,
    model: str,
    speed: float = 1.0,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    progress: Callable[[int], None] | None = None,
) -> list[LiveOutcome]:
    """Send each request at its (scaled) arrival time; wait for all; outcomes in order."""
    if speed <= 0:
        raise ValueError("speed must be positive")
    url = target.rstrip("/") + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    done = 0

    def finished(_: object) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done)

    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers
    ) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        first_ms = requests[0].timestamp_ms if requests else 0
        tasks = []
        for request in requests:
            arrival = (request.timestamp_ms - first_ms) / 1000.0 / speed
            delay = start + arrival - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {
                "model": model,
                "messages": [
                    {"role": "user", "content": prompt_text(request, block_tokens=block_tokens)}
                ],
                "max_tokens": max(1, request.output_length),
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            task = asyncio.create_task(_send(session, url, body, arrival))
            task.add_done_callback(finished)
            tasks.append(task)
        return list(await asyncio.gather(*tasks))


async def _send(
    session: aiohttp.ClientSession, url: str, body: dict[str, object], arrival: float
) -> LiveOutcome:
    started = time.perf_counter()
    try:
        async with session.post(url, data=orjson.dumps(body)) as response:
            if response.status != 200:
                text = (await response.text())[:200]
                return LiveOutcome(arrival, response.status, 0, 0, None, text)
            ttft, usage = await read_stream(response, started)
    except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as error:
        return LiveOutcome(arrival, 0, 0, 0, None, f"{type(error).__name__}: {error}")
    if usage is None:
        return LiveOutcome(arrival, 200, 0, 0, ttft, "no usage in the stream")
    prompt, cached = parse_usage(usage)
    return LiveOutcome(arrival, 200, prompt, cached, ttft)


async def first_model(target: str, key: str) -> str:
    """The first model the gateway lists at /v1/models: the default replay target."""
    url = target.rstrip("/") + "/v1/models"
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(headers=headers) as session, session.get(url) as response:
        response.raise_for_status()
        data = orjson.loads(await response.read())
    models = data.get("data") or []
    if not models:
        raise ValueError(f"{url} lists no models")
    return str(models[0]["id"])


def parse_usage(usage: dict[str, object]) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of an OpenAI-style usage object; cached 0 if absent."""
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return (
        prompt if isinstance(prompt, int) else 0,
        cached if isinstance(cached, int) else 0,
    )


async def read_stream(
    response: aiohttp.ClientResponse, started: float
) -> tuple[float | None, dict[str, Any] | None]:
    """Read an OpenAI stream to its end: seconds from ``started`` (perf_counter) to the first
    generated token, and the usage chunk's usage (None when the stream had none)."""
    ttft: float | None = None
    usage: dict[str, Any] | None = None
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        chunk = orjson.loads(payload)
        if ttft is None and _has_output(chunk):
            ttft = time.perf_counter() - started
        if chunk.get("usage"):
            usage = chunk["usage"]
    return ttft, usage


def _has_output(chunk: dict[str, Any]) -> bool:
    """A chunk that carries generated text (or reasoning), or ends a choice."""
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")):
            return True
        if choice.get("finish_reason"):
            return True
    return False


async def record_totals(target: str, key: str, *, start: date, end: date) -> StatementTotals:
    """The caller's own recorded totals for UTC days start..end (kvgate's statement API)."""
    url = f"{target.rstrip('/')}/v1/billing/statement?start={start}&end={end}&format=json"
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Authorization": f"Bearer {key}"}) as reply,
    ):
        if reply.status != 200:
            raise RuntimeError(f"statement request failed ({reply.status}): {await reply.text()}")
        statement = await reply.json()
    return StatementTotals.of(statement)
