"""Response ids scoped to the tenant that made them, so that one tenant cannot continue
another's stored conversation.

A stored response lives upstream (in a vLLM replica's memory, or at OpenAI under the
operator's one key), where every tenant is the same caller: whoever names its id in
``previous_response_id`` continues it. So the id a client is given is the upstream's with
a tag, an HMAC of the tenant and that id under the gateway's secret:

    resp_abc123   (upstream)   ->   resp_abc123_k3f9c0d1e2a4b5c6d7e8   (the client's)

A follow-up is checked and its tag taken off before anything else sees it; an id without
the caller's tag (another tenant's, a made-up one, one from before ids were tagged) is a
404 that says the same whichever it is, so nothing tells whether it exists. Nothing is
kept: the check holds across restarts and between the gateway's workers and instances.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncGenerator
from typing import Any

import orjson
from starlette.responses import Response

from gateway.errors import ResponseNotFound
from gateway.serving.streaming import EventStream
from gateway.upstream import sse

MARK = "_k"  # between the upstream's id and its tag
TAG_CHARS = 20  # hex characters: 80 bits, not to be guessed by trying
ID_FIRST = b'{"id":"'  # how a Response starts, as vLLM, OpenAI and orjson write it


class ResponseIds:
    """Tags and checks the Responses API ids of one gateway (its secret)."""

    def __init__(self, secret: str) -> None:
        self.key = hmac.new(secret.encode(), b"kvgate response ids", hashlib.sha256).digest()

    def tag(self, tenant_id: str, upstream_id: str) -> str:
        """The id the tenant is given for the upstream's ``upstream_id``."""
        message = tenant_id.encode() + b"\0" + upstream_id.encode()
        digest = hmac.new(self.key, message, hashlib.sha256).hexdigest()[:TAG_CHARS]
        return f"{upstream_id}{MARK}{digest}"

    def untag(self, tenant_id: str, client_id: str) -> str:
        """The upstream's id behind ``client_id``, if the tenant was given it; else a 404."""
        upstream_id, mark, _ = client_id.rpartition(MARK)
        if not mark or not hmac.compare_digest(self.tag(tenant_id, upstream_id), client_id):
            raise ResponseNotFound(
                f"Previous response with id '{client_id}' not found.",
                param="previous_response_id",
            )
        return upstream_id

    def tagged(
        self, response: Response, tenant_id: str, previous: tuple[str, str] | None = None
    ) -> Response:
        """The answer with the upstream's response id replaced by the tenant's, whole or
        as its events go out, and the ``previous`` (upstream, client's) id given back as
        the client sent it; errors are left as they are."""
        if response.status_code != 200:
            return response
        swaps = [(_quoted(previous[0]), _quoted(previous[1]))] if previous else []
        if isinstance(response, EventStream):
            response.body_iterator = self._events(response.body_iterator, tenant_id, swaps)
            return response
        body = bytes(response.body)
        found = _answer_id(body)
        if found is not None:
            swaps.append((_quoted(found), _quoted(self.tag(tenant_id, found))))
        for old, new in swaps:
            body = body.replace(old, new)
        response.body = body
        response.headers["content-length"] = str(len(body))
        return response

    async def _events(
        self, events: Any, tenant_id: str, swaps: list[tuple[bytes, bytes]]
    ) -> AsyncGenerator[bytes, None]:
        """The stream's events, the response's id in them (from response.created on)
        replaced by the tenant's."""
        found: str | None = None
        try:
            async for chunk in events:
                if found is None:
                    found = _response_id(chunk)
                    if found is not None:
                        swaps.append((_quoted(found), _quoted(self.tag(tenant_id, found))))
                for old, new in swaps:
                    chunk = chunk.replace(old, new)
                yield chunk
        finally:
            await events.aclose()


def _answer_id(body: bytes) -> str | None:
    """A whole Response's id: read where the gateway writes it (first), else parsed out."""
    if body.startswith(ID_FIRST):
        end = body.find(b'"', len(ID_FIRST))
        if end > 0 and b"\\" not in body[len(ID_FIRST) : end]:
            return body[len(ID_FIRST) : end].decode()
    data = orjson.loads(body) if body else None
    found = data.get("id") if isinstance(data, dict) else None
    return found if isinstance(found, str) else None


def _quoted(text: str) -> bytes:
    return b'"' + text.encode() + b'"'


def _response_id(chunk: bytes) -> str | None:
    """The id of the Response in the first event of ``chunk`` that carries one."""
    for event in sse.EventSplitter().feed(chunk):
        payload = sse.payload(event)
        if not payload or not payload.startswith(b"{"):
            continue
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        response = data.get("response") if isinstance(data, dict) else None
        found = response.get("id") if isinstance(response, dict) else None
        if isinstance(found, str):
            return found
    return None
