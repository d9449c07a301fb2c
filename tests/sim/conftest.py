"""A simulated replica on 127.0.0.1 with an ephemeral port, and an openai client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import openai
import pytest
from aiohttp import web

from gateway.tools.sim.server import SimConfig, create_app


@dataclass(frozen=True)
class RunningSim:
    """A started simulator: its base URL and an official client pointed at it."""

    base: str
    api: openai.AsyncOpenAI


SimFactory = Callable[[SimConfig], AbstractAsyncContextManager[RunningSim]]


@asynccontextmanager
async def running_sim(config: SimConfig) -> AsyncIterator[RunningSim]:
    """Serve the simulator as `serve` does (no access log, handlers cancelled on disconnect)."""
    runner = web.AppRunner(create_app(config), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    api = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    try:
        yield RunningSim(base, api)
    finally:
        await api.close()
        await runner.cleanup()


@pytest.fixture
def sim() -> SimFactory:
    return running_sim
