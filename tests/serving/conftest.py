"""The request path in-process: a gateway from ``create_app(settings)`` and its replicas
(scripted ones, or the simulator's own application), all served on loopback in the test's
event loop, over a fresh database on each backend.

Model ``m`` bills at 3 / 0.30 / 15 USD per million uncached, cached and output tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.db.models import RequestRow
from gateway.db.session import make_engine
from gateway.tools.sim.server import SimConfig
from gateway.tools.sim.server import create_app as sim_app
from gateway.tools.sim.timing import TimingModel
from pricing.book import Price
from tests.factories import Tenant, config_file, price, tenants, vllm
from tests.support.inprocess import (
    Gateway,
    gateway_settings,
    running_gateway,
    serving_aiohttp,
)
from tests.support.upstream import Scripted

PRICE = price("m", "2026-01-01", input="3", cache_read="0.30", output="15")
D = Decimal
ZERO = D("0E-9")
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]  # 30 characters


def chat(*, stream: bool = False, usage: bool = True, **fields: Any) -> dict[str, Any]:
    """A chat request body for model ``m`` (streams ask for usage unless told not to)."""
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES, **fields}
    if stream:
        body["stream"] = True
        if usage:
            body["stream_options"] = {"include_usage": True}
    return body


async def hang_up_once_sent(
    gateway: Gateway, key: str, replica: Scripted, body: dict[str, Any]
) -> None:
    """Send a request, and close the connection as soon as the replica has it."""
    async with gateway.http(key) as http:
        sending = asyncio.ensure_future(http.post(CHAT, json=body))
        await replica.until(lambda r: bool(r.bodies))
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending


@dataclass(frozen=True)
class StartsWith:
    """Equal to any string that starts with ``prefix`` (messages quoting aiohttp's own)."""

    prefix: str

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith(self.prefix)


def facts(row: RequestRow) -> dict[str, Any]:
    """What a record says about its attempt, as the tests compare it."""
    return {
        "request_id": row.request_id,
        "attempt": row.attempt,
        "status": row.status,
        "upstream": row.upstream,
        "tokens": (
            row.uncached_tokens,
            row.cache_read_tokens,
            row.cache_write_tokens,
            row.output_tokens,
        ),
        "source": row.usage_source,
        "cost": row.cost_total,
        "finish": row.finish_reason,
        "error": row.error,
        "stream": row.stream,
        "first_token": row.first_token_at is not None,
    }


def attempt(
    request_id: str,
    upstream: str,
    *,
    number: int = 1,
    status: str = "completed",
    tokens: tuple[int, int, int, int] = (0, 0, 0, 0),
    source: str = "reported",
    cost: Decimal = ZERO,
    finish: str | None = None,
    error: Any = None,
    stream: bool = False,
    first_token: bool = False,
) -> dict[str, Any]:
    """The facts a record should have (``facts``), with the defaults of a plain request."""
    return {
        "request_id": request_id if number == 1 else f"{request_id}.{number}",
        "attempt": number,
        "status": status,
        "upstream": upstream,
        "tokens": tokens,
        "source": source,
        "cost": cost,
        "finish": finish,
        "error": error,
        "stream": stream,
        "first_token": first_token,
    }


@dataclass
class Harness:
    """Builds one test's replicas and gateway; everything stops with the test."""

    tmp: Path
    database_url: str
    tenant: Tenant
    stack: contextlib.AsyncExitStack
    servers: dict[str, contextlib.AsyncExitStack] = field(default_factory=dict)
    # For property tests: one replica and one gateway for all of a test's examples.
    kept: dict[str, Any] = field(default_factory=dict)

    async def serve(self, app: web.Application) -> str:
        """Serve a replica's aiohttp application on loopback; its URL."""
        server = contextlib.AsyncExitStack()
        url = await server.enter_async_context(serving_aiohttp(app))
        self.servers[url] = server
        self.stack.push_async_callback(server.aclose)
        return url

    async def stop(self, url: str) -> None:
        """Stop serving a replica: its port refuses connections from now on."""
        await self.servers.pop(url).aclose()

    async def scripted(self, *answers: Any) -> tuple[Scripted, str]:
        """A replica answering as scripted, and its URL."""
        replica = Scripted().then(*answers)
        return replica, await self.serve(replica.app())

    def add_prices(self, *prices: Price) -> None:
        """More price entries (before the gateway starts: it loads the book then)."""
        engine = make_engine(self.database_url)
        try:
            tenants(engine, prices=prices)
        finally:
            engine.dispose()

    async def sim(self, **config: Any) -> str:
        """The simulator's own application (instant timing unless told), and its URL."""
        config.setdefault("timing", TimingModel.zero())
        return await self.serve(sim_app(SimConfig(model="m", **config)))

    async def gateway(self, *entries: dict[str, Any], **settings: Any) -> Gateway:
        """A gateway serving these deployments (``tests.factories.vllm`` entries)."""
        config = config_file(self.tmp / "kvgate.yaml", entries)
        options = gateway_settings(self.database_url, self.tmp, config, **settings)
        return await self.stack.enter_async_context(running_gateway(options))

    async def shared_scripted(self) -> tuple[Scripted, str]:
        """The test's one scripted replica, made on the first call (``answers`` to be set)."""
        if "replica" not in self.kept:
            self.kept["replica"] = await self.scripted()
        replica: tuple[Scripted, str] = self.kept["replica"]
        return replica

    async def shared(self, *replicas: str) -> Gateway:
        """The test's one gateway over ``replicas`` (``one``), made on the first call."""
        if "gateway" not in self.kept:
            self.kept["gateway"] = await self.one(*replicas)
        gateway: Gateway = self.kept["gateway"]
        return gateway

    async def one(self, *replicas: str, **fields: Any) -> Gateway:
        """A gateway with one deployment ``m`` over these replicas, tried in their order."""
        fields.setdefault("policy", "round-robin")
        fields.setdefault("connect_timeout_s", 2)
        return await self.gateway(vllm("m", replicas, **fields))


@pytest.fixture
async def harness(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    engine = make_engine(database_url)
    made = tenants(engine, "acme", prices=[PRICE])
    engine.dispose()
    async with contextlib.AsyncExitStack() as stack:
        yield Harness(tmp_path, database_url, made["acme"], stack)
