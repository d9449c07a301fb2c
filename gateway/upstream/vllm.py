"""The one module that talks HTTP to upstreams without litellm, vLLM replicas and hosted
providers on their own wire: a pooled aiohttp session.

aiohttp is the client because it holds up under concurrency where httpx collapses
(benchmarks/README.md, "Why the code is the way it is"); one session, created in the
app's lifespan, serves every call. A call's ``headers`` (a provider's key) go beside the
JSON content type.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.errors import UpstreamError


class UpstreamConnectError(UpstreamError):
    """The replica could not be reached or dropped the connection before answering.

    No byte reached the client, so another replica can serve the request. ``answered``:
    the reply's status had come when the connection broke (its body had not); else no
    byte of a reply came (refused, or a kept-alive connection the upstream had closed), so
    the same upstream may well answer on a new connection.
    """

    retryable = True
    answered = False


def make_session(*, limit: int = 0) -> aiohttp.ClientSession:
    """A pooled session for upstream calls, of at most ``limit`` connections (0: no limit)."""
    connector = aiohttp.TCPConnector(limit=limit, ttl_dns_cache=300, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
        # One session serves every tenant: a cookie an upstream set must never ride along
        # on another tenant's request (and not keeping a jar saves its work per request).
        cookie_jar=aiohttp.DummyCookieJar(),
    )


@dataclass(slots=True)
class UpstreamReply:
    status: int
    body: bytes
    content_type: str


_JSON_HEADERS = {"content-type": "application/json"}


def _failure(
    url: str, exc: aiohttp.ClientError | TimeoutError, *, answered: bool = False
) -> UpstreamError:
    """A failed POST as the gateway's error: unreachable (retryable), timed out, or other."""
    if isinstance(exc, aiohttp.ClientOSError | aiohttp.ServerDisconnectedError):
        error = UpstreamConnectError(f"upstream unreachable: {url}: {exc}")
        error.answered = answered
        return error
    if isinstance(exc, TimeoutError):
        return UpstreamError(f"upstream timed out: {url}")
    return UpstreamError(f"upstream error: {url}: {exc}")


def json_object(raw: bytes) -> dict[str, Any] | None:
    """A reply body as a JSON object; None when it is not one."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _headers(extra: Mapping[str, str] | None) -> Mapping[str, str]:
    return _JSON_HEADERS if not extra else {**_JSON_HEADERS, **extra}


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    timeout: aiohttp.ClientTimeout,
    headers: Mapping[str, str] | None = None,
) -> UpstreamReply:
    """POST a JSON body and read the whole reply."""
    sent = _headers(headers)
    answered = False
    try:
        async with session.post(url, data=body, headers=sent, timeout=timeout) as reply:
            answered = True
            data = await reply.read()
            return UpstreamReply(reply.status, data, reply.content_type)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _failure(url, exc, answered=answered) from exc


class UpstreamStream:
    """A streaming POST: the status first, then the body's bytes as they arrive."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        body: bytes,
        timeout: aiohttp.ClientTimeout,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._context = session.post(url, data=body, headers=_headers(headers), timeout=timeout)
        self._reply: aiohttp.ClientResponse | None = None
        self.url = url

    async def open(self) -> int:
        """Send the request; the reply's status, or UpstreamConnectError / UpstreamError."""
        try:
            self._reply = await self._context.__aenter__()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failure(self.url, exc) from exc
        return self._reply.status

    async def read_all(self) -> bytes:
        """The whole reply body."""
        assert self._reply is not None
        return await self._reply.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; a timeout or a break raises UpstreamError."""
        assert self._reply is not None
        try:
            async for data in self._reply.content.iter_any():
                yield data
        except TimeoutError as exc:
            raise UpstreamError(f"upstream stream timed out: {self.url}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"upstream stream broke: {self.url}: {exc}") from exc

    async def close(self) -> None:
        """Close the reply's connection, which cancels the upstream request."""
        if self._reply is not None:
            self._reply.close()  # closes the connection: cancels the upstream request
            self._reply = None
