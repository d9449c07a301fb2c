"""One OpenAI-compatible endpoint as the test plan sees it: streamed chat requests timed to
the first token, the endpoint's own cache config where it shows one, and kvgate's statement.

TTFT is measured from just before the request is written to the first chunk that carries
output text (the role-only chunk some servers send first does not count), or that finishes
the choice: a first token that ends the answer (end of sequence) carries no text. Usage comes from
the stream's final chunk (``stream_options.include_usage``); ``cached_tokens`` is 0 when
the endpoint does not report ``prompt_tokens_details``.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import date
from typing import Any

import aiohttp
import orjson

from gateway.routing.load import CacheConfig, read_load
from gateway.tools.replay.live import parse_usage, read_stream


class TargetError(Exception):
    """The target did not answer the run's first request: nothing else would be measured."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request as the client saw it."""

    status: int  # HTTP status; 0 when no response came
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float | None
    latency_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Completed: a 200 with usage and no transport error."""
        return self.status == 200 and self.error is None


def server_root(base_url: str) -> str:
    """The server's root from a base URL given with or without ``/v1`` (and trailing
    slashes), as the openai SDK's ``base_url`` is usually written: requests go to
    ``{root}/v1/...`` and vLLM's ``/metrics`` is at ``{root}/metrics``."""
    root = base_url.strip().rstrip("/")
    if root.endswith("/v1"):
        root = root.removesuffix("/v1").rstrip("/")
    scheme, _, rest = root.partition("://")
    if scheme not in ("http", "https") or not rest:
        raise ValueError(
            f"want an http(s) base URL such as http://127.0.0.1:8000/v1, not {base_url!r}"
        )
    return root


def key_salt(key: str) -> str:
    """A ``cache_salt`` derived from an API key (for raw vLLM, which has no tenants)."""
    return "cachetest-" + hashlib.sha256(key.encode()).hexdigest()[:32]


class Endpoint:
    """A pooled aiohttp session to one target (a base URL, with or without ``/v1``);
    ``async with`` opens and closes it."""

    def __init__(
        self,
        target: str,
        model: str,
        *,
        max_tokens: int = 4,
        timeout_s: float = 300.0,
    ) -> None:
        self.target = server_root(target)
        self.model = model
        self.max_tokens = max_tokens
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Endpoint:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=self._timeout
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session; RuntimeError outside ``async with``."""
        if self._session is None:
            raise RuntimeError("Endpoint used outside `async with`")
        return self._session

    async def chat(self, key: str, text: str, *, salt: str | None = None) -> Outcome:
        """Send one user message, streamed; time its first token; read its usage."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if salt is not None:
            body["cache_salt"] = salt
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        started = time.perf_counter()
        ttft: float | None = None
        try:
            async with self.session.post(
                self.target + "/v1/chat/completions", data=orjson.dumps(body), headers=headers
            ) as response:
                if response.status != 200:
                    detail = (await response.text())[:300]
                    return Outcome(
                        response.status, 0, 0, 0, None, time.perf_counter() - started, detail
                    )
                ttft, usage = await read_stream(response, started)
        except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as error:
            latency = time.perf_counter() - started
            return Outcome(0, 0, 0, 0, ttft, latency, f"{type(error).__name__}: {error}")
        latency = time.perf_counter() - started
        if usage is None:
            return Outcome(200, 0, 0, 0, ttft, latency, "no usage in the stream")
        prompt, cached = parse_usage(usage)
        output = usage.get("completion_tokens")
        return Outcome(200, prompt, cached, output if isinstance(output, int) else 0, ttft, latency)

    async def cache_config(self) -> CacheConfig | None:
        """The target's block size and cache size, when it serves vLLM's /metrics."""
        load = await read_load(self.session, self.target)
        return None if load is None else load.cache

    async def statement(self, key: str, *, start: date, end: date) -> dict[str, Any] | None:
        """kvgate's billing statement of the key's tenant (JSON), or None when not kvgate."""
        url = f"{self.target}/v1/billing/statement?start={start}&end={end}&format=json"
        try:
            async with self.session.get(url, headers={"Authorization": f"Bearer {key}"}) as reply:
                if reply.status != 200:
                    return None
                document = orjson.loads(await reply.read())
        except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError):
            return None
        if not isinstance(document, dict) or document.get("object") != "billing.statement":
            return None
        return document
