"""A stream's cost in HTTP trailers: the ``x-kvgate-cost`` and ``x-kvgate-cached-tokens`` a
whole answer carries in its headers come after a stream's last event, declared in its
``trailer`` header, for clients that read no usage. Read with h11 (the HTTP/1.1 parser
under httpx, which keeps trailers its clients do not show), on a kept-alive connection
that then serves a whole answer and another stream, against the simulator in-process.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import h11
import orjson

from tests.serving.conftest import CHAT, Harness, chat
from tests.support.inprocess import Gateway


class Connection:
    """One kept-alive HTTP/1.1 connection to the gateway, spoken with h11."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    async def post(
        self, path: str, body: dict[str, Any], key: str
    ) -> tuple[dict[str, str], bytes, dict[str, str]]:
        """Headers, body and trailers of one answer."""
        raw = orjson.dumps(body)
        headers = [
            ("host", "gateway"),
            ("authorization", f"Bearer {key}"),
            ("content-type", "application/json"),
            ("content-length", str(len(raw))),
        ]
        self.writer.write(self.h11.send(h11.Request(method="POST", target=path, headers=headers)))
        self.writer.write(self.h11.send(h11.Data(data=raw)))
        self.writer.write(self.h11.send(h11.EndOfMessage()))
        await self.writer.drain()
        head: dict[str, str] = {}
        data = b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.reader.read(65536))
            elif isinstance(event, h11.Response):
                head = {n.decode(): v.decode() for n, v in event.headers}
                assert event.status_code == 200, event
            elif isinstance(event, h11.Data):
                data += event.data
            elif isinstance(event, h11.EndOfMessage):
                self.h11.start_next_cycle()
                return head, data, {n.decode(): v.decode() for n, v in event.headers}


async def connect(gateway: Gateway) -> Connection:
    address = urlsplit(gateway.url)
    assert address.hostname is not None and address.port is not None
    return Connection(*await asyncio.open_connection(address.hostname, address.port))


def usage_of(stream: bytes) -> dict[str, Any]:
    """The billed usage of a chat stream's usage chunk."""
    chunks = [orjson.loads(e[6:]) for e in stream.split(b"\n\n") if e.startswith(b"data: {")]
    (usage,) = [c["usage"] for c in chunks if c.get("usage")]
    return usage  # type: ignore[no-any-return]


async def test_a_stream_ends_with_its_cost_in_trailers_on_a_kept_alive_connection(
    harness: Harness,
) -> None:
    """A stream's trailers say what its usage chunk and its record say; a whole answer on
    the same connection has them as headers and no trailers; a second stream the same."""
    gateway = await harness.one(await harness.sim(), price_model="m")
    connection = await connect(gateway)
    key = harness.tenant.key
    body = chat(stream=True, max_tokens=6)
    for _ in range(2):  # the second: a kept-alive connection after a trailing response
        head, stream, trailers = await connection.post(CHAT, body, key)
        assert head["trailer"] == "x-kvgate-cost, x-kvgate-cached-tokens"
        assert "x-kvgate-cost" not in head
        usage = usage_of(stream)
        assert stream.endswith(b"data: [DONE]\n\n")
        assert trailers == {
            "x-kvgate-cost": usage["cost"],
            "x-kvgate-cached-tokens": str(usage["prompt_tokens_details"]["cached_tokens"]),
        }
        [row] = await gateway.attempts(head["x-request-id"])
        assert row.cost_total == Decimal(trailers["x-kvgate-cost"]) > 0
        assert row.cache_read_tokens == usage["prompt_tokens_details"]["cached_tokens"]
        head, whole, trailers = await connection.post(CHAT, chat(max_tokens=3), key)
        assert (head["x-kvgate-cost"], trailers) == (orjson.loads(whole)["usage"]["cost"], {})
        assert "trailer" not in head
    connection.writer.close()


async def test_a_messages_stream_ends_with_its_cost_in_trailers(harness: Harness) -> None:
    """Anthropic's Messages stream: the same trailers, the cost its record has."""
    gateway = await harness.one(await harness.sim(), price_model="m")
    connection = await connect(gateway)
    body = {
        "model": "m",
        "max_tokens": 4,
        "stream": True,
        "messages": [{"role": "user", "content": "Say something short."}],
    }
    head, stream, trailers = await connection.post("/v1/messages", body, harness.tenant.key)
    assert b"event: message_stop" in stream
    [row] = await gateway.attempts(head["x-request-id"])
    assert trailers == {
        "x-kvgate-cost": f"{row.cost_total:f}",
        "x-kvgate-cached-tokens": str(row.cache_read_tokens),
    }
    connection.writer.close()
