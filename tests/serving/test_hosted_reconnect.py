"""A hosted target whose connection fails before any byte of a reply is tried once more on
the same target, then the next: in-process, the official ``openai`` client → the gateway →
tests/providers' emulator behind a middleware that drops the connection of its first
requests as soon as they have arrived (what the gateway sees when a provider closed the
kept-alive connection it was reusing: the request sent, the connection gone, no reply).

Each try is an attempt on record; a connection broken after the reply's status had come is
not retried on the same target (the provider may have done the work), it fails over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal

import openai
import pytest
from aiohttp import web

from gateway.db.models import RequestRow
from tests.factories import litellm
from tests.providers.emulator import Emulator
from tests.providers.prices import GPT
from tests.serving.conftest import Harness
from tests.serving.test_hosted_chat import MESSAGES, TEXT
from tests.support.inprocess import Gateway

D = Decimal
KEY_ENV = "KVGATE_TEST_OPENAI_KEY"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Dropping:
    """The emulator, dropping the connection of its next ``drops`` requests: before any
    byte of a reply, or (``after_status``) once the status line and headers have gone."""

    emulator: Emulator
    drops: int = 0
    after_status: bool = False
    received: int = 0

    def app(self) -> web.Application:
        app = self.emulator.app()
        app.middlewares.append(self._drop)
        return app

    @web.middleware
    async def _drop(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.received += 1
        if self.drops <= 0:
            return await handler(request)
        self.drops -= 1
        await request.read()
        reply = web.StreamResponse(headers={"content-type": "application/json"})
        reply.content_length = 1000
        if self.after_status:
            await reply.prepare(request)
        assert request.transport is not None
        request.transport.close()
        return reply


@dataclass
class World:
    dropping: Dropping
    fallback: Emulator
    gateway: Gateway
    client: openai.AsyncOpenAI


@pytest.fixture
async def world(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    monkeypatch.setenv(KEY_ENV, "sk-openai-test")
    dropping, fallback = Dropping(Emulator()), Emulator()
    first, second = await harness.serve(dropping.app()), await harness.serve(fallback.app())
    harness.add_prices(GPT)
    target = {"api_key_env": KEY_ENV, "price_model": GPT.model}
    gateway = await harness.gateway(
        litellm(
            "gpt",
            "openai/openai-cached",
            api_base=first + "/v1",
            **target,
            fallbacks=[
                {"litellm_model": "openai/openai-priority", "api_base": second + "/v1", **target}
            ],
        )
    )
    client = gateway.client(harness.tenant.key)
    yield World(dropping, fallback, gateway, client)
    await client.close()


async def _ask(world: World, *, stream: bool) -> list[RequestRow]:
    """One chat, streamed or not; its attempts' records."""
    if stream:
        made = await world.client.chat.completions.create(
            model="gpt",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
        )
        request_id = made.response.headers["x-request-id"]
        text = "".join([c.choices[0].delta.content or "" async for c in made if c.choices])
    else:
        raw = await world.client.chat.completions.with_raw_response.create(
            model="gpt",
            messages=MESSAGES,  # type: ignore[arg-type]
        )
        request_id = raw.headers["x-request-id"]
        text = raw.parse().choices[0].message.content or ""
    assert text == TEXT
    return await world.gateway.attempts(request_id)


def _facts(rows: list[RequestRow]) -> list[tuple[int, str, str, Decimal]]:
    return [(r.attempt, r.status, r.upstream, r.cost_total) for r in rows]


FAILED = D("0E-9")
CACHED = D("0.001104000")  # openai-cached: 176 x 2 + 1024 x 0.50 + 30 x 8 per million
PRIORITY = D("0.008400000")  # openai-priority: 2000 x 3.50 + 100 x 14 per million


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_dropped_connection_is_tried_again_on_the_same_target(
    world: World, stream: bool
) -> None:
    world.dropping.drops = 1
    rows = await _ask(world, stream=stream)
    assert _facts(rows) == [
        (1, "failed", "openai/openai-cached", FAILED),
        (2, "completed", "openai/openai-cached", CACHED),
    ]
    assert rows[0].error is not None
    assert rows[0].error.startswith("openai/openai-cached: upstream unreachable: http://")
    assert "Server disconnected" in rows[0].error
    assert rows[1].request_id == rows[0].request_id + ".2"
    assert (world.dropping.received, len(world.fallback.requests)) == (2, 0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_second_failure_fails_over_to_the_next_target(world: World, stream: bool) -> None:
    world.dropping.drops = 2
    rows = await _ask(world, stream=stream)
    assert _facts(rows) == [
        (1, "failed", "openai/openai-cached", FAILED),
        (2, "failed", "openai/openai-cached", FAILED),
        (3, "completed", "openai/openai-priority", PRIORITY),
    ]
    assert rows[0].error == rows[1].error
    assert (world.dropping.received, len(world.fallback.requests)) == (2, 1)


async def test_a_connection_broken_after_the_status_fails_over_without_a_second_try(
    world: World,
) -> None:
    """The provider had begun its answer: the same target is not asked again."""
    world.dropping.drops, world.dropping.after_status = 3, True
    rows = await _ask(world, stream=False)
    assert _facts(rows) == [
        (1, "failed", "openai/openai-cached", FAILED),
        (2, "completed", "openai/openai-priority", PRIORITY),
    ]
    assert rows[0].error is not None and "upstream unreachable" not in rows[0].error
    assert (world.dropping.received, len(world.fallback.requests)) == (1, 1)
