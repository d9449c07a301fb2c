"""The gateway app in this process, for tests that send it thousands of requests: the
ASGI app from ``create_app`` (lifespan entered) behind httpx's ASGI transport, a kvgate sim
and the provider emulator on loopback, all on one event loop in a thread.

Three deployments: ``text-mode`` and ``token-mode`` (the sim's tokenizer) vLLM, and
``hosted`` through litellm to the emulator's Anthropic wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson
import yaml

from gateway.api.calls import Endpoint
from gateway.app import create_app
from gateway.config import Settings
from gateway.db import crud
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from gateway.tools.sim.server import SimConfig
from gateway.tools.sim.server import create_app as create_sim
from gateway.tools.sim.timing import TimingModel
from pricing.book import load_catalog
from tests.providers.emulator import Emulator
from tests.providers.emulator import start as start_emulator

T = TypeVar("T")
MODEL = "kvgate/demo-llama-8b"
TEXT, TOKENS, HOSTED = "text-mode", "token-mode", "hosted"


class App:
    """The gateway with its sim and emulator, on one event loop in a thread."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.stop = asyncio.Event()
        self.client: httpx.AsyncClient | None = None
        self.key = ""
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> App:
        self.thread.start()
        self.ready.wait(120)
        if self.error is not None:
            raise self.error
        assert self.client is not None, "the app did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(60)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(300)

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:
            self.error = exc
            self.ready.set()

    async def _serve(self) -> None:
        async with self._stack():
            self.ready.set()
            await self.stop.wait()

    @contextlib.asynccontextmanager
    async def _stack(self) -> AsyncIterator[None]:
        from aiohttp import web

        sim = web.AppRunner(
            create_sim(SimConfig(model=MODEL, timing=TimingModel.zero(), max_model_len=4096)),
            access_log=None,
        )
        await sim.setup()
        site = web.TCPSite(sim, "127.0.0.1", 0)
        await site.start()
        sim_url = "http://{}:{}".format(*sim.addresses[0][:2])
        emulator, emulator_url = await start_emulator(Emulator())
        database_url = f"sqlite:///{self.tmp / 'kvgate.db'}"
        upgrade(database_url)
        engine = make_engine(database_url)
        with transaction(session_factory(engine)) as session:
            crud.add_prices(session, prices=load_catalog())
            crud.create_tenant(session, name="fuzz")
            self.key = crud.create_key(session, tenant_name="fuzz").key
        engine.dispose()
        config = self.tmp / "kvgate.yaml"
        vllm = {"replicas": [sim_url], "upstream_model": MODEL, "price_model": MODEL}
        models = [
            {"name": TEXT, **vllm},
            {"name": TOKENS, "tokenizer": "kvgate-sim", **vllm},
            {
                "name": HOSTED,
                "backend": "litellm",
                "litellm_model": "anthropic/anthropic-cache-write",
                "api_base": emulator_url,
                "price_model": MODEL,
            },
        ]
        config.write_text(yaml.safe_dump({"models": models}))
        app = create_app(
            Settings(
                database_url=database_url,
                config=config,
                journal_dir=self.tmp / "journal",
                recorder_process=False,
                log_level="warning",
            )
        )
        try:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
                    self.client = c
                    yield
        finally:
            await emulator.cleanup()
            await sim.cleanup()

    async def post(self, endpoint: Endpoint, body: bytes) -> tuple[int, dict[str, Any]]:
        assert self.client is not None
        headers = {"authorization": f"Bearer {self.key}", "content-type": "application/json"}
        reply = await self.client.post(endpoint.value, content=body, headers=headers)
        content = reply.content
        if reply.headers.get("content-type", "").startswith("text/event-stream"):
            return reply.status_code, {"stream": content[-40:].decode(errors="replace")}
        return reply.status_code, orjson.loads(content)
