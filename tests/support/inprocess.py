"""The request path in the test's own event loop: the gateway and its upstreams on loopback.

``running_gateway(settings)`` builds the app with ``create_app(settings)``, runs its
lifespan, and serves it with uvicorn (as ``kvgate serve`` does, httptools included) on a
free loopback port; ``serving_aiohttp(app)`` serves an aiohttp application (the sim's,
or a test's own upstream) as ``kvgate sim`` does. Nothing here knows how the request path
is built inside: tests speak HTTP to the gateway and read the records it writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import uvicorn
from aiohttp import web
from fastapi import FastAPI
from sqlalchemy import Engine, select
from starlette.types import ASGIApp

from gateway.app import create_app
from gateway.config import Settings
from gateway.db.models import RequestRow
from gateway.db.session import make_engine, session_factory
from gateway.server import GatewayConfig, limits
from tests.support.processes import free_port

READY_TIMEOUT_S = 30.0
SERVER_OPTIONS: dict[str, Any] = {
    "log_level": "warning",
    "access_log": False,
    "timeout_graceful_shutdown": 5,
}


def loopback_socket() -> socket.socket:
    """A listening-ready socket on a free loopback port (bound, so no other test takes it)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def refusing_url() -> str:
    """The URL of a replica that refuses connections: a port nobody listens on."""
    return f"http://127.0.0.1:{free_port()}"


@contextlib.asynccontextmanager
async def serving_asgi(app: ASGIApp, *, lifespan: str = "off") -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn in a task of this loop; its base URL."""
    config = uvicorn.Config(app, lifespan=lifespan, http="httptools", **SERVER_OPTIONS)
    async with serving_config(config) as url:
        yield url


@contextlib.asynccontextmanager
async def serving_config(config: uvicorn.Config) -> AsyncIterator[str]:
    """Serve with uvicorn as ``config`` says, in a task of this loop; its base URL."""
    sock = loopback_socket()
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not server.started:
        if task.done():
            task.result()  # its exception, if it has one
            raise RuntimeError("uvicorn stopped before it started serving")
        if time.monotonic() > deadline:
            raise TimeoutError("uvicorn did not start")
        await asyncio.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def serving_aiohttp(app: web.Application) -> AsyncIterator[str]:
    """Serve an aiohttp app as ``kvgate sim`` does (no access log, handlers cancelled when
    their client goes away); its base URL."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def gateway_settings(
    database_url: str, directory: Path, config: Path, **overrides: Any
) -> Settings:
    """Settings for a test's gateway: its database, journal and deployments file; records
    written by a thread (no child process to start) and flushed at once; no background
    health or price refresh in the middle of a test unless it asks for one."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "config": config,
        "journal_dir": directory / "journal",
        "recorder_process": False,
        "recorder_flush_interval_s": 0.02,
        "health_interval_s": 3600.0,
        "load_interval_s": 3600.0,
        "price_refresh_s": 3600.0,
        "key_refresh_s": 3600.0,
        "log_level": "warning",
        **overrides,
    }
    return Settings(**values)


@dataclass
class Gateway:
    """A gateway served in this event loop, and what tests read back from it."""

    url: str
    settings: Settings
    engine: Engine  # the test's own connection to the gateway's database
    app: FastAPI  # its state holds what the lifespan built (the gateway's own engine, ...)

    def client(self, key: str) -> openai.AsyncOpenAI:
        """The official client, pointed at this gateway (no retries of its own)."""
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def http(self, key: str) -> httpx.AsyncClient:
        """A raw HTTP client with the key, for what the official client hides."""
        return httpx.AsyncClient(
            base_url=self.url, headers={"authorization": f"Bearer {key}"}, timeout=30
        )

    async def recorded(self, timeout_s: float = 15.0) -> None:
        """Wait until every record the gateway has journaled is in the database."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.url) as client:
            while True:
                health = (await client.get("/healthz")).json()
                if health["recorder_backlog"] == 0:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"records not written after {timeout_s} s: {health}")
                await asyncio.sleep(0.01)

    async def attempts(
        self, interaction_id: str | None = None, count: int | None = None, timeout_s: float = 15.0
    ) -> list[RequestRow]:
        """The records of one interaction (of all, without one), by attempt; with
        ``count``, once there are that many (a cancelled stream's record is kept just
        after the client left)."""
        query = select(RequestRow).order_by(RequestRow.started_at, RequestRow.attempt)
        if interaction_id is not None:
            query = query.where(RequestRow.interaction_id == interaction_id)
        deadline = time.monotonic() + timeout_s
        while True:
            await self.recorded(timeout_s)
            with session_factory(self.engine)() as session:
                rows = list(session.scalars(query))
            if count is None or len(rows) >= count or time.monotonic() > deadline:
                return rows
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running_gateway(settings: Settings) -> AsyncIterator[Gateway]:
    """``create_app(settings)`` with its lifespan run, served on loopback in this loop by
    the protocol ``kvgate serve`` runs (its connection limits, and a client's leaving told
    to the handler)."""
    app = create_app(settings)
    engine = make_engine(settings.database_url)
    try:
        # The lifespan is entered here rather than by uvicorn, so that a failure to start
        # is raised in the test instead of logged by the server.
        served = GatewayConfig(app, limits=limits(settings), lifespan="off", **SERVER_OPTIONS)
        async with app.router.lifespan_context(app), serving_config(served) as url:
            yield Gateway(url=url, settings=settings, engine=engine, app=app)
    finally:
        engine.dispose()
