"""HTTP trailers for uvicorn's httptools cycle: ASGI's ``http.response.trailers`` extension.

A stream's headers leave before its cost is known; its trailer fields come after its
last chunk, when it is. A response that sends ``http.response.start`` with
``"trailers": True`` ends its body as usual (``more_body`` false) and then sends
``{"type": "http.response.trailers", "headers": [...]}``: the body's last chunk is held
open until then, and the trailers end it (``0\\r\\n``, the fields, ``\\r\\n``). A response
that is not chunked (an HTTP/1.0 client, or a ``content-length``) cannot carry
trailers: its body ends as it would have, and the trailers are dropped. The scope says
the server takes them (``scope["extensions"]["http.response.trailers"]``), as the ASGI
spec has it; an app served elsewhere sees no such extension and sends none.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, RequestResponseCycle

TRAILERS = "http.response.trailers"


class TrailingCycle(RequestResponseCycle):
    """uvicorn's request-response cycle, with trailer fields after a chunked body."""

    trailing = False  # the response said it will send trailers
    held = False  # its body ended; the terminating chunk waits for them

    async def send(self, message: Any) -> None:
        """Send as uvicorn does, but end a trailing body only with its trailers."""
        kind = message["type"]
        if kind == "http.response.start":
            self.trailing = bool(message.get("trailers"))
        elif kind == "http.response.body" and self.trailing and not message.get("more_body"):
            if self.chunked_encoding and not self.disconnected:
                self.held = True
                message = {**message, "more_body": True}
        elif kind == TRAILERS:
            if self.held:
                self._end_with(message.get("headers", ()))
            return
        await super().send(message)

    def _end_with(self, fields: Any) -> None:
        """The terminating chunk with the trailer fields; the response is complete."""
        self.held = False
        if self.disconnected:
            return
        lines = [b"0\r\n"]
        for name, value in fields:
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP trailer value.")
            lines += [name.lower(), b": ", value, b"\r\n"]
        lines.append(b"\r\n")
        self.transport.write(b"".join(lines))
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
