"""A vLLM replica under the test's control: an aiohttp app that speaks vLLM's wire format
and answers each request as the test scripted it, well or badly.

    upstream = Scripted()
    upstream.then(Answer(completion(usage=vllm_usage(1000, 20, cached=640))))
    upstream.then(Stream([role(), token("Hi"), last("stop"), usage_chunk(...)], end="drop"))

Answers are taken in order; the last one repeats. What the gateway sent is kept
(``bodies``), and so is what happened to a stream the gateway closed (``cancelled``).
The wire shapes come from the simulator's own protocol module, which tests/sim checks
against vLLM's; a malformed answer is a test's deliberate edit of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiohttp import web

from gateway.tools.sim.protocol import DONE_EVENT, Reply, usage

Script = Callable[[web.Request], Awaitable[web.StreamResponse]]
CHAT = Reply("chatcmpl-scripted", 1_767_225_600, "m", chat=True)
COMPLETION = Reply("cmpl-scripted", 1_767_225_600, "m", chat=False)


def vllm_usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict[str, Any]:
    """vLLM's usage object (``--enable-prompt-tokens-details``): cached inside the prompt."""
    return usage(prompt_tokens, completion_tokens, cached)


def completion(
    text: str = "Paris.", finish: str = "stop", usage: Any = None, *, chat: bool = True
) -> dict[str, Any]:
    """A whole non-streaming answer, as a dict a test may spoil before it is sent."""
    reply = CHAT if chat else COMPLETION
    body: dict[str, Any] = orjson.loads(reply.body(text, finish, {}))
    body["usage"] = usage
    return body


def role() -> bytes:
    """The first chat chunk, naming the role."""
    return CHAT.role_event(include_usage=False)


def token(text: str, finish: str | None = None) -> bytes:
    """A chunk of output text (with the finish reason on the last one)."""
    return CHAT.token_event(text, finish, include_usage=False)


def usage_chunk(usage: Any) -> bytes:
    """The closing usage-only chunk of ``stream_options.include_usage``."""
    chunk = orjson.loads(CHAT.usage_event({}).removeprefix(b"data: "))
    return b"data: " + orjson.dumps({**chunk, "usage": usage}) + b"\n\n"


def event(data: bytes | str) -> bytes:
    """Any one SSE event (a test's own bytes after ``data: ``)."""
    return b"data: " + (data.encode() if isinstance(data, str) else data) + b"\n\n"


DONE = DONE_EVENT


@dataclass(frozen=True)
class Answer:
    """A whole answer: a JSON value (or raw bytes) with a status."""

    body: Any
    status: int = 200
    content_type: str = "application/json"

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        raw = self.body if isinstance(self.body, bytes) else orjson.dumps(self.body)
        return web.Response(body=raw, status=self.status, content_type=self.content_type)


@dataclass(frozen=True)
class Stream:
    """Bytes of a stream, one write each (whole events, or pieces of them), then: ``eof``
    (a clean end), ``drop`` (the replica dies: the connection is cut with the response
    unfinished) or ``hang`` (nothing more, until the gateway goes away). ``pause_s``
    between writes makes a slow replica, and makes each write its own read."""

    events: Sequence[bytes]
    end: Literal["eof", "drop", "hang"] = "eof"
    pause_s: float = 0.0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Cache-Control": "no-cache"})
        response.content_type = "text/event-stream"
        await response.prepare(request)
        for data in self.events:
            await response.write(data)
            if self.pause_s:
                await asyncio.sleep(self.pause_s)
        if self.end == "drop":
            assert request.transport is not None
            request.transport.abort()
            return response
        if self.end == "hang":
            await asyncio.Event().wait()
        await response.write_eof()
        return response


@dataclass(frozen=True)
class Hang:
    """No answer at all until the gateway gives up or goes away."""

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class Drop:
    """Read the request, then cut the connection without a byte of answer."""

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        assert request.transport is not None
        request.transport.abort()
        return web.Response()


def stream(
    *texts: str, finish: str = "stop", usage: Any = None, done: bool = True, **options: Any
) -> Stream:
    """A well-formed chat stream of these texts (usage chunk when given; ``[DONE]``)."""
    events = [role(), *(token(t) for t in texts[:-1]), token(texts[-1], finish)]
    if usage is not None:
        events.append(usage_chunk(usage))
    if done:
        events.append(DONE)
    return Stream(events, **options)


@dataclass
class Scripted:
    """The replica: answers in order (the last repeats), and what it was sent."""

    model: str = "m"
    answers: list[Script] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    healthy: bool = True
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def then(self, *answers: Script) -> Scripted:
        self.answers.extend(answers)
        return self

    async def until(self, condition: Callable[[Scripted], bool], timeout_s: float = 10.0) -> None:
        """Wait until ``condition`` holds of the replica (a request arrived, was cancelled)."""
        async with asyncio.timeout(timeout_s):
            while not condition(self):
                self._changed.clear()
                await self._changed.wait()

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(orjson.loads(await request.read()))
        self._changed.set()
        if not self.answers:
            raise AssertionError("the replica was sent a request no answer was scripted for")
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        try:
            return await answer(request)
        except asyncio.CancelledError:
            self.cancelled += 1  # the gateway closed the connection: vLLM aborts here
            self._changed.set()
            raise

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200 if self.healthy else 503)

    def app(self) -> web.Application:
        """The aiohttp application (serve it with ``serving_aiohttp``)."""
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._generate),
                web.post("/v1/completions", self._generate),
                web.post("/v1/responses", self._generate),
                web.post("/v1/messages", self._generate),
                web.post("/v1/messages/count_tokens", self._generate),
                web.get("/health", self._health),
            ]
        )
        return app
