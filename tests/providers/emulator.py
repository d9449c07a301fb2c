"""Local stand-ins for hosted providers: aiohttp apps that replay recorded wire responses.

Hosted providers cannot be reached from here, so this is the one fake the tests use, at
the network edge, and it speaks each provider's exact wire format. A request names its
case by the model it asks for (in the body, or in the URL for Gemini):

- ``fixtures/<case>.json``: the non-streaming response body;
- ``fixtures/<case>.sse``: the full stream, events separated by blank lines, sent one by
  one (``event_delay_s`` apart, so a test can abandon a stream half way);
- a case whose name contains ``-error-NNN`` answers with status NNN and its ``.json`` body;
- ``fixtures/<case>.count.json``: Anthropic's ``/v1/messages/count_tokens`` answer.

OpenAI's routes are under ``/v1`` (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/responses``), Anthropic's at ``/v1/messages`` and
``/v1/messages/count_tokens``, Gemini's under ``/v1beta/models``.

Every request body received is kept in ``requests``, so tests can check what was sent.
Run it alone with ``python -m tests.providers.emulator --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

FIXTURES = Path(__file__).parent / "fixtures"
_ERROR_CASE = re.compile(r"-error-(\d{3})")


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Emulator:
    fixtures: Path = FIXTURES
    event_delay_s: float = 0.0
    requests: list[Received] = field(default_factory=list)
    keep: bool = True  # every request in ``requests`` (a process of its own reads none)

    def app(self) -> web.Application:
        # Bodies as large as the gateway passes on (aiohttp's own limit is 1 MiB).
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/completions", self._openai)
        app.router.add_post("/v1/embeddings", self._openai)
        app.router.add_post("/v1/responses", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_post("/v1beta/models/{action}", self._gemini)
        app.router.add_get("/health", self._health)
        return app

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body = await self._receive(request)
        return await self._replay(request, str(body.get("model")), bool(body.get("stream")))

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        body = await self._receive(request)
        return await self._replay(request, str(body.get("model")), bool(body.get("stream")))

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        body = await self._receive(request)
        return await self._replay(request, f"{body.get('model')}.count", stream=False)

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        await self._receive(request)
        model, _, method = request.match_info["action"].partition(":")
        return await self._replay(request, model, method == "streamGenerateContent")

    async def _receive(self, request: web.Request) -> dict[str, Any]:
        body = orjson.loads(await request.read())
        if self.keep:
            self.requests.append(Received(request.path, dict(request.headers), body))
        return body  # type: ignore[no-any-return]

    async def _replay(self, request: web.Request, case: str, stream: bool) -> web.StreamResponse:
        error = _ERROR_CASE.search(case)
        if error is not None or not stream:
            path = self.fixtures / f"{case}.json"
            if not path.exists():
                return web.json_response({"error": {"message": f"no fixture {case}"}}, status=404)
            status = int(error.group(1)) if error else 200
            return web.Response(
                body=path.read_bytes(), status=status, content_type="application/json"
            )
        path = self.fixtures / f"{case}.sse"
        if not path.exists():
            missing = {"error": {"message": f"no stream fixture {case}"}}
            return web.json_response(missing, status=404)
        reply = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        await reply.prepare(request)
        for event in events(path.read_text()):
            if self.event_delay_s:
                await asyncio.sleep(self.event_delay_s)
            await reply.write(event.encode())
        await reply.write_eof()
        return reply


def events(text: str) -> list[str]:
    """The events of a recorded stream, each with its terminating blank line."""
    return [chunk.strip("\n") + "\n\n" for chunk in text.split("\n\n") if chunk.strip()]


async def start(emulator: Emulator, port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve in the running loop; returns the runner (to clean up) and the base URL."""
    runner = web.AppRunner(emulator.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    host, bound = runner.addresses[0][:2]
    return runner, f"http://{host}:{bound}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--event-delay-s", type=float, default=0.0)
    parser.add_argument(
        "--forget-requests", action="store_true", help="keep no request (large bodies)"
    )
    args = parser.parse_args()
    emulator = Emulator(event_delay_s=args.event_delay_s, keep=not args.forget_requests)
    web.run_app(emulator.app(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
