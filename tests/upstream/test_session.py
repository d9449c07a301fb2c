"""The one upstream session every tenant's requests share keeps no cookies."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.upstream.vllm import make_session


async def test_a_cookie_an_upstream_sets_never_rides_on_the_next_request() -> None:
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        response = web.json_response({"ok": True})
        response.set_cookie("session", "tenant-a-secret")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with TestServer(app, host="127.0.0.1") as server:
        session = make_session()
        try:
            # By name, as replicas usually are: aiohttp's own jar keeps no cookies of bare IPs.
            url = f"http://localhost:{server.port}/v1/chat/completions"
            for _ in range(2):
                async with session.post(url, data=b"{}") as r:
                    assert r.status == 200 and "session" in r.cookies
        finally:
            await session.close()
    assert seen == [None, None]
