"""Large request bodies: a real gateway's memory per body, at its peak and after.

Sixteen clients send a 3.9 MiB body each, all at once, to `kvgate serve` in front of
an instant `kvgate sim`, and in front of a hosted provider on OpenAI's own wire (the
provider emulator). The gateway's peak resident memory (VmHWM, reset just before through
/proc/PID/clear_refs, so no spike between two samples is missed) may grow by at most twice
the bodies in flight, and once they are answered its memory must come back down: buffers
of that size are returned to the system, not kept in malloc's arenas. Three shapes of
body: one long message (also streamed, through litellm), thousands of short turns, a prompt
of token ids. Not yet safely within the bounds (NOT_YET): thousands of short turns leave 3
to 20 MiB resident after a burst, and a chat litellm translates, whole or streamed, peaks
near twice its bodies (its text parsed, and litellm's serialized copy of it, both held
until the provider answers, or a stream ends).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator

import aiohttp
import pytest
import uvloop
from aiohttp import http_writer
from starlette.requests import Request
from starlette.types import Message

from gateway.api.inference import read_body
from gateway.server import write_bodies_unjoined
from tests.factories import litellm, vllm
from tests.faults.conftest import INSTANT, MODEL, Stack, make_stack
from tests.reliability.wire import reset_peak, status_kib

pytestmark = pytest.mark.e2e

CLIENTS = 16
BODY_BYTES = int(3.9 * 1024 * 1024)
MIB = 1024 * 1024
BURSTS = 3
SETTLE_S = 1.0
# Released: back within a quarter of a body per request of where the first burst began
# (before the fix, the first burst alone left 67 MiB behind).
KEPT_AFTER = 16 * MIB


def chat_body(size: int) -> bytes:
    """A chat body of exactly ``size`` bytes: one long user message of ordinary words."""
    words = "the quick brown fox jumps over the lazy dog and keeps running far away "
    shell = json.dumps(
        {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": ""}]}
    ).encode()
    filler = (words * (size // len(words) + 1))[: size - len(shell)]
    body = shell.replace(b'"content": ""', b'"content": "' + filler.encode() + b'"')
    assert len(body) == size
    return body


def streamed_chat_body(size: int) -> bytes:
    """``chat_body`` asking for a stream: the same size, its answer as server-sent events."""
    asked = b'"stream": true, '
    body = chat_body(size - len(asked)).replace(b'"max_tokens"', asked + b'"max_tokens"', 1)
    assert len(body) == size and json.loads(body)["stream"] is True
    return body


def many_messages_body(size: int) -> bytes:
    """A chat body of exactly ``size`` bytes: thousands of short turns (an agent's long
    history), many small objects where the other has one string."""
    turn = "a short turn of an agent's history, number "
    shell = len(json.dumps({"model": MODEL, "max_tokens": 4, "messages": []}))
    each = len(json.dumps({"role": "user", "content": f"{turn}000000"})) + 2  # and ", "
    turns = [{"role": "user", "content": f"{turn}{n:06d}"} for n in range((size - shell) // each)]
    body = json.dumps({"model": MODEL, "max_tokens": 4, "messages": turns})
    turns[0]["content"] += "x" * (size - len(body))
    encoded = json.dumps({"model": MODEL, "max_tokens": 4, "messages": turns}).encode()
    assert len(encoded) == size
    return encoded


def token_ids_body(size: int) -> bytes:
    """A completions body of exactly ``size`` bytes whose prompt is token ids: the
    shape that grows most when parsed (a 28-byte int object for every few bytes)."""
    shell = json.dumps({"model": MODEL, "max_tokens": 4, "prompt": []}).encode()
    ids: list[str] = []
    length = len(shell)
    n = 0
    while length + len(str(1000 + n % 30000)) + 2 <= size:
        ids.append(str(1000 + n % 30000))
        length += len(ids[-1]) + (2 if len(ids) > 1 else 0)
        n += 1
    body = shell.replace(b'"prompt": []', b'"prompt": [' + ", ".join(ids).encode() + b"]")
    body = body.replace(b'"max_tokens": 4', b'"max_tokens": 4' + b" " * (size - len(body)))
    assert len(body) == size and json.loads(body)["max_tokens"] == 4
    return body


# Hosted deployments on OpenAI's own wire (the provider emulator), named as long as MODEL
# so that a body's size stays exact when its model is renamed.
HOSTED = {"/v1/chat/completions": "kvgate/hosted-chat-1", "/v1/completions": "kvgate/hosted-text-1"}
HOSTED_CASES = {"/v1/chat/completions": "openai-cached", "/v1/completions": "openai-completion"}
# The same provider's chat through litellm (``via: litellm``): the translated path.
TRANSLATED = "kvgate/litellm-chat1"
assert all(len(name) == len(MODEL) for name in (*HOSTED.values(), TRANSLATED))
STREAMED = "one-long-message-streamed"  # through litellm only (its stream's own path)
# (body of a size, the endpoint it goes to)
SHAPES = {
    "one-long-message": (chat_body, "/v1/chat/completions"),
    STREAMED: (streamed_chat_body, "/v1/chat/completions"),
    "many-small-messages": (many_messages_body, "/v1/chat/completions"),
    "token-id-prompt": (token_ids_body, "/v1/completions"),
}
# At the bounds, or past them (one burst each in the suite, an xpass is no failure), by
# (shape, backend). A chat litellm translates: the parsed text and litellm's serialized
# body are both held until the provider answers (a stream: until it ends), twice the body
# for each request in flight, so the peak is how many overlap: 1.44-1.94x in nine runs
# on 2026-12-05 once aiohttp no longer joined each body to its head (gateway/server:
# five more copies at the peak; 1.93 and 2.08x in two runs before), a stream 2.02-2.08x
# in three.
# Released: the call is followed by a collection, a stream lets go of its request when
# closed (gateway/upstream/providers.py, provider_stream.py: httpx's response and its
# stream kept the serialized body in a cycle; a stream's, 52-56 MiB a second after).
# Thousands of short turns: peaks within the bound, but the ~58,000 objects each parsed
# body makes open a dozen pymalloc arenas, and the few small objects that outlive a burst
# keep them resident: within the bounds in every run on 2026-12-05 (+2.7 to +11.1 MiB
# kept), but 11-20 MiB before, against the 16 MiB.
NOT_YET = {
    ("many-small-messages", "vllm"): "peaks at 1.2-1.4x; 3-20 MiB stay resident after",
    ("many-small-messages", "hosted"): "peaks at 1.0-1.3x; 3-12 MiB stay resident after",
    ("one-long-message", "translated"): "peaks at 1.4-1.9x; released, within 3.1 MiB",
    (STREAMED, "translated"): "peaks at 2.0-2.1x; released, within 1.1 MiB",
}
CASES = [
    *((shape, backend) for shape in SHAPES for backend in ("vllm", "hosted") if shape != STREAMED),
    ("one-long-message", "translated"),
    (STREAMED, "translated"),
]


async def send_all(
    url: str, key: str, body: bytes, clients: int, path: str = "/v1/chat/completions"
) -> list[int]:
    """The statuses of ``clients`` requests of ``body`` sent at once."""
    return [status for status, _ in await answers(url, key, body, clients, path)]


async def answers(
    url: str, key: str, body: bytes, clients: int, path: str
) -> list[tuple[int, bytes]]:
    """Status and answer of ``clients`` requests of ``body`` sent at once."""
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> tuple[int, bytes]:
            async with session.post(url + path, data=body, headers=headers) as r:
                return r.status, await r.read()

        return await asyncio.gather(*(one() for _ in range(clients)))


def prompt_tokens(body: bytes) -> int | None:
    """The prompt's tokens as the replica counts them, where that is known from the body
    alone (token ids: one each)."""
    prompt = json.loads(body).get("prompt")
    return len(prompt) if isinstance(prompt, list) else None


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("large-bodies")
    stack = make_stack(
        tmp,
        f"sqlite:///{tmp / 'kvgate.db'}",
        replicas=1,
        sim_args=(*INSTANT, "--max-model-len", "4000000", "--capacity-blocks", "65536"),
        start=False,
        # The replica tokenizes sixteen long prompts in a row: not a reason to take it out.
        KVGATE_HEALTH_INTERVAL_S="600",
    )
    try:
        emulator = stack.start_emulator("--forget-requests")
        hosted = [
            litellm(
                HOSTED[path],
                f"openai/{HOSTED_CASES[path]}",
                api_base=emulator.url + "/v1",
                price_model=MODEL,
            )
            for path in HOSTED
        ]
        translated = litellm(
            TRANSLATED,
            "openai/openai-cached",
            via="litellm",
            api_base=emulator.url + "/v1",
            price_model=MODEL,
        )
        stack.configure([vllm(MODEL, stack.sim_urls), *hosted, translated])
        stack.start_gateway()
        yield stack
    finally:
        stack.close()


def rename(body: bytes, model: str) -> bytes:
    """The body for another deployment (a name as long: the same size)."""
    renamed = body.replace(json.dumps(MODEL).encode(), json.dumps(model).encode(), 1)
    assert len(renamed) == len(body)
    return renamed


@pytest.mark.parametrize(
    ("shape", "backend"),
    [
        pytest.param(*case, marks=pytest.mark.xfail(reason=NOT_YET[case], strict=False))
        if case in NOT_YET
        else case
        for case in CASES
    ],
)
def test_sixteen_concurrent_large_bodies_peak_under_twice_their_size_and_are_released(
    stack: Stack, shape: str, backend: str
) -> None:
    """Three bursts (one to a hosted provider): each peaks under twice its bodies, and after
    each the gateway is back within KEPT_AFTER of where the first began; for each shape of
    body, to a vLLM replica and to a hosted provider on its own wire."""
    assert stack.gateway is not None
    pid = stack.gateway.process.pid
    maker, path = SHAPES[shape]
    model = {"vllm": MODEL, "hosted": HOSTED[path], "translated": TRANSLATED}[backend]

    def make(size: int) -> bytes:
        return rename(maker(size), model)

    body = make(BODY_BYTES)
    # Warm up every path a body takes, and the connection pools (both sides) at this width.
    small = make(4096)
    assert asyncio.run(send_all(stack.url, stack.key, small, CLIENTS, path)) == [200] * CLIENTS
    answered = asyncio.run(answers(stack.url, stack.key, body, 2, path))
    assert [status for status, _ in answered] == [200, 200]
    # What the replica was sent is the whole prompt (token ids read compactly are spliced
    # back into the upstream body as they came).
    if backend == "vllm" and (expected := prompt_tokens(body)) is not None:
        assert [json.loads(a)["usage"]["prompt_tokens"] for _, a in answered] == [expected] * 2
    time.sleep(SETTLE_S)
    start = status_kib(pid, "VmRSS")
    failures = []
    # The hosted paths once each (their own costs: what is held while a provider answers);
    # three bursts, to show memory coming back each time, on the vLLM path.
    bursts = BURSTS if backend == "vllm" and (shape, backend) not in NOT_YET else 1
    for burst in range(1, bursts + 1):
        before = status_kib(pid, "VmRSS")
        reset_peak(pid)
        statuses = asyncio.run(send_all(stack.url, stack.key, body, CLIENTS, path))
        peak = status_kib(pid, "VmHWM")
        time.sleep(SETTLE_S)
        after = status_kib(pid, "VmRSS")
        growth, kept = (peak - before) * 1024, (after - start) * 1024
        print(
            f"\n{shape} ({backend}), burst {burst}: {CLIENTS} concurrent bodies of "
            f"{BODY_BYTES / MIB:.1f} MiB: "
            f"gateway RSS {before / 1024:.1f} MiB before, {peak / 1024:.1f} MiB peak "
            f"(+{growth / MIB:.1f} MiB, {growth / CLIENTS / BODY_BYTES:.2f}x a body per "
            f"request), {after / 1024:.1f} MiB after ({kept / MIB:+.1f} MiB from the start)"
        )
        assert statuses == [200] * CLIENTS
        if growth > 2 * CLIENTS * BODY_BYTES or kept > KEPT_AFTER:
            failures.append(burst)
    assert failures == []


FREED = """
import os, sys
def rss_mib():
    for line in open(f"/proc/{os.getpid()}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
from gateway.server import release_large_buffers
if sys.argv[1] == "tuned":
    release_large_buffers()
size = 4 * 1024 * 1024
first = b"x" * size  # glibc raises its mmap threshold when a mapped block is freed
del first
before = rss_mib()
bodies = [b"x" * size for _ in range(16)]
small = [bytes(64) for _ in range(10000)]  # allocated among them, as a server does
del bodies
print(before, rss_mib())
"""


@pytest.mark.parametrize("allocator", ["tuned", "glibc default"])
def test_freed_large_buffers_go_back_to_the_system(allocator: str) -> None:
    """What every serving process does at start (gateway.server.release_large_buffers):
    16 bodies of 4 MiB, freed, leave nothing resident. glibc's default keeps them."""
    done = subprocess.run(
        [sys.executable, "-c", FREED, allocator], capture_output=True, text=True, check=True
    )
    before, after = map(int, done.stdout.split())
    if allocator == "tuned":
        assert after - before <= 4
    else:  # the behaviour the tuning exists for, still there without it
        assert after - before >= 48


async def _read(body: bytes, chunk: int) -> tuple[bytes | bytearray, int]:
    """``read_body`` of a body arriving in pieces; what it returned and its peak memory."""
    offset = 0

    async def receive() -> Message:
        # Each piece a new object, as the server's are.
        nonlocal offset
        piece, offset = body[offset : offset + chunk], offset + chunk
        return {"type": "http.request", "body": piece, "more_body": offset < len(body)}

    scope = {"type": "http", "headers": [(b"content-length", b"%d" % len(body))]}
    tracemalloc.start()
    try:
        read = await read_body(Request(scope, receive), limit=len(body))
        return read, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_body_in_pieces_is_read_into_one_buffer_not_pieces_and_their_join() -> None:
    body = b"x" * (4 * 1024 * 1024)
    read, peak = asyncio.run(_read(body, 64 * 1024))
    assert read == body
    # One buffer grown in place (bytearray over-allocates by an eighth); the pieces and
    # their join held it twice.
    assert peak <= 1.25 * len(body)


async def _post_peak(body: bytes) -> int:
    """Peak memory allocated while aiohttp posts ``body`` (made before tracing began) to a
    server that reads it all and answers."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        while length:
            length -= len(await reader.read(min(length, 64 * 1024)))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            tracemalloc.start()
            try:
                async with session.post(f"http://127.0.0.1:{port}/", data=body) as reply:
                    assert reply.status == 200
                return tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    finally:
        server.close()


@pytest.mark.parametrize("unjoined", [True, False])
def test_aiohttp_sends_a_large_body_without_a_copy_joined_to_its_head(
    unjoined: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What every serving process does at start (gateway.server.write_bodies_unjoined), on
    uvloop as they run: a 4 MiB body goes to the socket as it is. aiohttp's default on
    Python before 3.12.9 joins it to its head first, a whole copy."""
    monkeypatch.setattr(http_writer, "SKIP_WRITELINES", http_writer.SKIP_WRITELINES)
    if unjoined:
        write_bodies_unjoined()
    body = b"x" * (4 * 1024 * 1024)
    peak = uvloop.run(_post_peak(body))
    if unjoined:
        assert peak < 0.25 * len(body)
    elif sys.version_info < (3, 12, 9):  # the copy the setting exists for
        assert peak >= len(body)
