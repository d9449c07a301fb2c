"""EventStream: a server-sent event response whose body stops when the client leaves.

Starlette's ``StreamingResponse`` does the same with an anyio task group per response
(a task, a cancel scope and the group's bookkeeping), a measurable share of a streamed
request's CPU (benchmarks/README.md). Here the server tells the stream when its client
goes (``LEAVING``, where it offers that), or else one asyncio task waits for
``http.disconnect``; either cancels the task sending the stream; the body's generator sees the
cancellation at the point it waits (for the upstream, usually), records the request as
cancelled and closes the upstream call.

uvicorn silently drops messages sent after a disconnect, so without the watcher an
abandoned stream would run to its end upstream, at the deployment's expense.

Where the server takes trailers (ASGI's ``http.response.trailers`` extension: ``kvgate
serve`` does, gateway/server/trailers.py), a stream with ``trailers`` declares their names
in a ``trailer`` header and sends them after its last event: the cost headers a whole
answer carries, which a stream can only know once it has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
TRAILERS = "http.response.trailers"  # the ASGI extension's name
# Where the server says it tells a handler that its client went (``kvgate serve``'s
# protocol, gateway/server/connections.py, which spells the same key): the scope's
# extensions name it, and a handler that wants to know puts a callable under it in the
# scope. A stream then needs no task of its own watching for ``http.disconnect``.
LEAVING = "kvgate.leaving"
GONE = "kvgate.gone"  # set in the scope by that server once the client went


def tell_when_gone(scope: Scope, leave: Callable[[], None]) -> None:
    """Have the server call ``leave`` when the client goes (at once if it has gone)."""
    scope[LEAVING] = leave
    if scope.get(GONE):
        leave()


@dataclass(frozen=True, slots=True)
class Trailers:
    """Fields a stream sends after its body: their names, and what they say once it ended."""

    names: tuple[str, ...]
    fields: Callable[[], Mapping[str, str]]


class EventStream(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        headers: Mapping[str, str] | None = None,
        *,
        ended: Callable[[], None] | None = None,
        trailers: Trailers | None = None,
    ) -> None:
        self.body_iterator = body
        self.trailers = trailers
        # Called once the response is over, however it ended: a body never started (the
        # client left first) runs none of its own cleanup.
        self.ended = ended
        self.status_code = 200
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the events; a client that leaves ends the stream quietly; ``ended`` runs last."""
        sending = asyncio.current_task()
        assert sending is not None
        left = False

        def leave() -> None:
            nonlocal left
            left = True
            sending.cancel()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            leave()

        extensions = scope.get("extensions") or {}
        watcher = None
        if LEAVING in extensions:
            tell_when_gone(scope, leave)
        else:
            watcher = asyncio.get_running_loop().create_task(watch())
        trailers = self.trailers if TRAILERS in extensions else None
        headers = self.raw_headers
        if trailers is not None:
            headers = [*headers, (b"trailer", ", ".join(trailers.names).encode("latin-1"))]
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": headers,
                    "trailers": trailers is not None,
                }
            )
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if trailers is not None:
                fields = [(k.encode(), v.encode()) for k, v in trailers.fields().items()]
                await send({"type": TRAILERS, "headers": fields, "more_trailers": False})
        except asyncio.CancelledError:
            if not left:
                raise  # cancelled from outside (shutdown): not ours to swallow
            sending.uncancel()  # the client left: the stream ends here, quietly
            # Cancelled while sending rather than inside the body: close it now, so it
            # records the cancellation and closes its upstream call.
            await self.body_iterator.aclose()
        finally:
            if watcher is not None:
                watcher.cancel()
            else:
                scope.pop(LEAVING, None)
            if self.ended is not None:
                self.ended()
