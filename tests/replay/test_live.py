"""Live replay: deterministic block texts, and a trace sent over real HTTP streaming.

The server here is the simulated replica's real engine (prefix cache, tokenizer, chat
template) behind a minimal OpenAI streaming endpoint on loopback: it stands in for the
gateway, which is tested against this client in the end-to-end suite.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from gateway.routing.sim_tokenizer import encode, render_chat
from gateway.tools.replay.live import (
    LiveOutcome,
    block_text,
    first_model,
    parse_usage,
    prompt_text,
    replay_live,
    summarize_live,
)
from gateway.tools.replay.trace import TraceRequest
from gateway.tools.sim.engine import Engine, GenerationRequest
from gateway.tools.sim.timing import TimingModel


def test_the_same_hash_id_gives_the_same_words() -> None:
    assert block_text(7, 16) == block_text(7, 16)
    assert block_text(7, 16) != block_text(8, 16)
    assert len(block_text(7, 512).split()) == 512
    assert block_text(7, 512).startswith(block_text(7, 100))
    assert block_text(7, 0) == ""


def test_prompts_sharing_hash_ids_share_a_text_prefix() -> None:
    short = prompt_text(TraceRequest(0, 1000, 1, (1, 2)), block_tokens=512)
    longer = prompt_text(TraceRequest(0, 1500, 1, (1, 2, 3)), block_tokens=512)
    assert len(short.split()) == 1000
    assert len(longer.split()) == 1500
    assert longer.startswith(short[: len(block_text(1, 512))])
    assert longer.startswith(block_text(1, 512) + block_text(2, 488))


def test_parse_usage() -> None:
    assert parse_usage({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}) == (
        10,
        4,
    )
    assert parse_usage({"prompt_tokens": 10, "prompt_tokens_details": None}) == (10, 0)
    assert parse_usage({}) == (0, 0)


def test_summary_counts_only_completed_requests() -> None:
    outcomes = [
        LiveOutcome(0.0, 200, 100, 40, 0.5),
        LiveOutcome(0.1, 200, 100, 0, 0.25),
        LiveOutcome(0.2, 503, 0, 0, None, "overloaded"),
    ]
    s = summarize_live(outcomes)
    assert (s.requests, s.completed, s.prompt_tokens, s.cached_tokens) == (3, 2, 200, 40)
    assert s.token_hit_rate == 0.2
    assert s.ttft_p50_s == pytest.approx(0.375)


@pytest.fixture
async def replica() -> AsyncIterator[str]:
    engine = Engine(block_size=16, capacity_blocks=1000, timing=TimingModel.zero())

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "sim-model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        assert request.headers["Authorization"] == "Bearer k"
        body = await request.json()
        tokens = encode(render_chat(body["messages"]))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async with engine.run(GenerationRequest(tokens, body["max_tokens"])) as generation:
            async for batch in generation.batches():
                chunk = {
                    "choices": [{"index": 0, "delta": {"content": "".join(t.text for t in batch)}}]
                }
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        usage = {
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": generation.cached_tokens},
        }
        await response.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_a_trace_replayed_live_hits_where_its_prefixes_repeat(replica: str) -> None:
    assert await first_model(replica, "k") == "sim-model"
    trace = [
        TraceRequest(0, 32, 3, (1, 2)),
        TraceRequest(50, 48, 3, (1, 2, 3)),
        TraceRequest(100, 20, 3, (9, 10)),
    ]
    seen: list[int] = []
    outcomes = await replay_live(
        trace,
        target=replica,
        key="k",
        model="sim-model",
        speed=1.0,
        block_tokens=16,
        progress=seen.append,
    )
    assert [o.status for o in outcomes] == [200, 200, 200]
    # One token per word, plus the template's "<|user|>" and "<|assistant|>" pieces; the
    # last word of a message carries its newline, so it is a token of its own kind.
    assert [o.prompt_tokens for o in outcomes] == [34, 50, 22]
    # The second request repeats the first one's two full blocks of 16 tokens.
    assert [o.cached_tokens for o in outcomes] == [0, 32, 0]
    assert all(o.ttft_s is not None for o in outcomes)
    assert [o.arrival_s for o in outcomes] == [0.0, 0.05, 0.1]
    assert sorted(seen) == [1, 2, 3]


async def test_speed_compresses_arrivals_and_errors_are_outcomes(replica: str) -> None:
    trace = [TraceRequest(0, 16, 1, (1,)), TraceRequest(1000, 16, 1, (1,))]
    outcomes = await replay_live(
        trace, target=replica, key="k", model="m", speed=10.0, block_tokens=16
    )
    assert [o.arrival_s for o in outcomes] == [0.0, 0.1]
    wrong = await replay_live(trace[:1], target=replica + "/nowhere", key="k", model="m")
    assert wrong[0].status == 404
    assert not wrong[0].ok
    with pytest.raises(ValueError, match="speed"):
        await replay_live(trace, target=replica, key="k", model="m", speed=0)
