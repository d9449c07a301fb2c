"""The simulator over HTTP, driven by the official openai client and by raw requests."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.routing.sim_tokenizer import encode
from gateway.tools.sim.server import SimConfig
from gateway.tools.sim.timing import TimingModel
from tests.sim.conftest import SimFactory

MODEL = "kvgate/demo-llama-8b"
CONFIG = SimConfig(block_size=4, capacity_blocks=256, timing=TimingModel.zero(), max_model_len=64)
# "<|user|>\n", "a ", ..., "i ", "j\n", "<|assistant|>\n": 12 tokens, 2 cacheable blocks of 4.
TEN_WORDS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "a b c d e f g h i j"}]
LABELS = f'{{engine="0",model_name="{MODEL}"}}'


def finished(reason: str) -> str:
    return (
        f'vllm:request_success_total{{engine="0",model_name="{MODEL}",finished_reason="{reason}"}}'
    )


async def post(base: str, path: str, body: object) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with aiohttp.ClientSession() as session, session.post(base + path, data=data) as r:
        return r.status, await r.read()


async def get(base: str, path: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(base + path) as r:
        return r.status, await r.read()


async def metric_values(base: str) -> dict[str, float]:
    _, text = await get(base, "/metrics")
    values: dict[str, float] = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


async def test_chat_completion_reports_exact_usage_and_full_block_hits(sim: SimFactory) -> None:
    async with sim(CONFIG) as s:
        first = await s.api.chat.completions.create(model=MODEL, messages=TEN_WORDS, max_tokens=5)
        second = await s.api.chat.completions.create(
            model=MODEL, messages=TEN_WORDS, max_completion_tokens=5
        )
    assert first.object == "chat.completion" and first.model == MODEL
    assert first.id.startswith("chatcmpl-")
    choice = first.choices[0]
    assert (choice.index, choice.finish_reason, choice.message.role) == (0, "length", "assistant")
    assert choice.message.content is not None and len(choice.message.content.split(" ")) == 5
    assert second.choices[0].message.content == choice.message.content
    assert first.usage is not None and second.usage is not None
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (12, 5)
    assert first.usage.total_tokens == 17
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens == 8


async def test_defaults_to_16_output_tokens_and_names_replies_after_x_request_id(
    sim: SimFactory,
) -> None:
    async with sim(CONFIG) as s:
        reply = await s.api.chat.completions.create(
            model=MODEL, messages=TEN_WORDS, extra_headers={"X-Request-Id": "abc123"}
        )
    assert reply.id == "chatcmpl-abc123"
    assert reply.usage is not None and reply.usage.completion_tokens == 16


async def test_cache_salt_isolates_and_a_next_turn_hits_the_previous_answer(
    sim: SimFactory,
) -> None:
    async with sim(CONFIG) as s:

        async def cached(messages: list[ChatCompletionMessageParam], salt: str) -> tuple[int, str]:
            reply = await s.api.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=7, extra_body={"cache_salt": salt}
            )
            assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            hit = reply.usage.prompt_tokens_details.cached_tokens
            return hit or 0, str(reply.choices[0].message.content)

        assert (await cached(TEN_WORDS, "tenant-a"))[0] == 0
        assert (await cached(TEN_WORDS, "tenant-b"))[0] == 0
        hit, answer = await cached(TEN_WORDS, "tenant-a")
        assert hit == 8
        turn2: list[ChatCompletionMessageParam] = [
            *TEN_WORDS,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "next"},
        ]
        # 12 prompt tokens + 6 fed output tokens = 18: 4 full blocks, the answer included.
        assert (await cached(turn2, "tenant-a"))[0] == 16


async def test_completions_take_a_string_or_token_ids(sim: SimFactory) -> None:
    async with sim(CONFIG) as s:
        text = await s.api.completions.create(
            model=MODEL, prompt="one two three four five", max_tokens=3
        )
        ids = await s.api.completions.create(model=MODEL, prompt=list(range(9)), max_tokens=2)
        again = await s.api.completions.create(model=MODEL, prompt=list(range(9)), max_tokens=2)
    assert text.object == "text_completion" and text.id.startswith("cmpl-")
    assert text.choices[0].finish_reason == "length"
    assert len(text.choices[0].text.split(" ")) == 3
    assert text.usage is not None
    assert (text.usage.prompt_tokens, text.usage.completion_tokens) == (5, 3)
    assert ids.usage is not None and ids.usage.prompt_tokens == 9
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 8


async def test_streaming_chat_with_include_usage(sim: SimFactory) -> None:
    async with sim(CONFIG) as s:
        stream = await s.api.chat.completions.create(
            model=MODEL,
            messages=TEN_WORDS,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        whole = await s.api.chat.completions.create(model=MODEL, messages=TEN_WORDS, max_tokens=4)
    assert len(chunks) == 1 + 4 + 1
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None, None, None, None, "length"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == whole.choices[0].message.content
    assert all(chunk.usage is None for chunk in chunks[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (12, 4)


async def test_stream_wire_format_is_sse_with_null_usage_and_done(sim: SimFactory) -> None:
    body = {
        "model": MODEL,
        "prompt": "x y z",
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with sim(CONFIG) as s:
        status, raw = await post(s.base, "/v1/completions", body)
        _, plain = await post(s.base, "/v1/completions", {**body, "stream_options": None})
    assert status == 200
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [orjson.loads(event.removeprefix(b"data: ")) for event in events[:-2]]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, "length"]
    assert [c["object"] for c in chunks] == ["text_completion"] * 3
    assert [c["usage"] for c in chunks[:-1]] == [None, None]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    plain_chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in plain.split(b"\n\n")[:-2]]
    assert len(plain_chunks) == 2 and all("usage" not in c for c in plain_chunks)


async def test_models_health_and_tokenize(sim: SimFactory) -> None:
    async with sim(CONFIG) as s:
        models = await s.api.models.list()
        health = await get(s.base, "/health")
        prompt = await post(s.base, "/tokenize", {"prompt": "hello world"})
        chat = await post(s.base, "/tokenize", {"messages": TEN_WORDS})
        bare = await post(
            s.base, "/tokenize", {"messages": TEN_WORDS, "add_generation_prompt": False}
        )
        neither = await post(s.base, "/tokenize", {"model": MODEL})
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [(MODEL, "model", "vllm")]
    assert health == (200, b"")
    assert orjson.loads(prompt[1]) == {
        "count": 2,
        "max_model_len": 64,
        "tokens": encode("hello world"),
        "token_strs": None,
    }
    assert orjson.loads(chat[1])["count"] == 12
    assert orjson.loads(bare[1])["count"] == 11
    assert neither[0] == 400


CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (CHAT, {"model": MODEL}, "'messages' must be a non-empty list of messages"),
        (CHAT, b"[1, 2]", "The request body must be a JSON object"),
        (
            CHAT,
            {"messages": TEN_WORDS, "max_tokens": "5"},
            "'max_tokens' must be an integer of at least 1",
        ),
        (
            CHAT,
            {"messages": TEN_WORDS, "max_tokens": 0},
            "'max_tokens' must be an integer of at least 1",
        ),
        (CHAT, {"messages": TEN_WORDS, "stream": "yes"}, "'stream' must be of type bool"),
        (CHAT, {"messages": TEN_WORDS, "cache_salt": 5}, "'cache_salt' must be of type str"),
        (
            CHAT,
            {"messages": TEN_WORDS, "stream_options": {"include_usage": True}},
            "Stream options can only be defined when `stream=True`.",
        ),
        (
            CHAT,
            {"messages": [{"role": "user", "content": 7}]},
            "message 'content' must be a string or a list of content parts",
        ),
        (CHAT, {"messages": ["hi"]}, "each item of 'messages' must be an object"),
        (
            "/v1/completions",
            {"prompt": [1, "a"]},
            "'prompt' must be a string or a list of token ids",
        ),
        ("/v1/completions", {"prompt": [-1]}, "Token id -1 is out of vocabulary"),
        ("/v1/completions", {"prompt": ""}, "The prompt cannot be empty"),
        (
            "/v1/completions",
            {"prompt": "a b", "max_tokens": 63},
            "'max_tokens' or 'max_completion_tokens' is too large: 63. This model's maximum "
            "context length is 64 tokens and your request has 2 input tokens (63 > 64 - 2).",
        ),
    ],
)
async def test_bad_requests_get_vllms_400_error_json(
    sim: SimFactory, path: str, body: object, message: str
) -> None:
    async with sim(CONFIG) as s:
        status, raw = await post(s.base, path, body)
    assert status == 400
    assert orjson.loads(raw) == {
        "error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    }


async def test_invalid_json_and_unknown_models(sim: SimFactory) -> None:
    async with sim(CONFIG) as s:
        status, raw = await post(s.base, CHAT, b"{not json")
        missing = await post(s.base, CHAT, {"model": "nope", "messages": TEN_WORDS})
        with pytest.raises(openai.NotFoundError) as not_found:
            await s.api.completions.create(model="nope", prompt="x")
        with pytest.raises(openai.BadRequestError):
            await s.api.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    assert status == 400 and orjson.loads(raw)["error"]["type"] == "BadRequestError"
    assert missing == (
        404,
        b'{"error":{"message":"The model `nope` does not exist.",'
        b'"type":"NotFoundError","param":null,"code":404}}',
    )
    assert not_found.value.status_code == 404


async def test_metrics_count_exactly_what_usage_reported(sim: SimFactory) -> None:
    async with sim(CONFIG) as s:
        chat = [
            await s.api.chat.completions.create(model=MODEL, messages=TEN_WORDS, max_tokens=n)
            for n in (3, 5)
        ]
        text = await s.api.completions.create(model=MODEL, prompt=list(range(9)), max_tokens=2)
        values = await metric_values(s.base)
        _, raw = await get(s.base, "/metrics")
    usages = [reply.usage for reply in chat] + [text.usage]
    assert [(u.prompt_tokens, u.completion_tokens) for u in usages if u] == [
        (12, 3),
        (12, 5),
        (9, 2),
    ]
    assert [
        u.prompt_tokens_details.cached_tokens for u in usages if u and u.prompt_tokens_details
    ] == [0, 8, 0]
    assert values[f"vllm:prefix_cache_queries_total{LABELS}"] == 33
    assert values[f"vllm:prefix_cache_hits_total{LABELS}"] == 8
    assert values[f"vllm:prompt_tokens_total{LABELS}"] == 33
    assert values[f"vllm:generation_tokens_total{LABELS}"] == 10
    assert values[finished("length")] == 3
    assert values[finished("abort")] == 0
    assert values[f"vllm:num_requests_running{LABELS}"] == 0
    assert values[f"vllm:num_requests_waiting{LABELS}"] == 0
    assert values[f"vllm:kv_cache_usage_perc{LABELS}"] == 0
    exposition = raw.decode()
    assert (
        'vllm:cache_config_info{block_size="4",enable_prefix_caching="True",engine="0",'
        f'model_name="{MODEL}",num_gpu_blocks="256",prefix_caching_hash_algo="sha256"}} 1.0'
    ) in exposition
    assert "# TYPE vllm:prefix_cache_hits_total counter" in exposition


async def test_reset_prefix_cache_forgets_every_block(sim: SimFactory) -> None:
    async with sim(CONFIG) as s:
        await s.api.completions.create(model=MODEL, prompt=list(range(9)), max_tokens=1)
        assert (await post(s.base, "/reset_prefix_cache", b""))[0] == 200
        again = await s.api.completions.create(model=MODEL, prompt=list(range(9)), max_tokens=1)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 0


async def test_a_client_that_goes_away_aborts_its_request(sim: SimFactory) -> None:
    slow = SimConfig(
        block_size=4, timing=TimingModel(prefill_tokens_per_s=0, decode_tokens_per_s=200)
    )
    body = {"model": MODEL, "messages": TEN_WORDS, "max_tokens": 200, "stream": True}
    async with sim(slow) as s:
        async with aiohttp.ClientSession() as session:
            response = await session.post(f"{s.base}{CHAT}", json=body)
            await response.content.readuntil(b"\n\n")
            response.close()
        for _ in range(100):
            values = await metric_values(s.base)
            if values[f"vllm:num_requests_running{LABELS}"] == 0:
                break
            await asyncio.sleep(0.01)
    assert values[f"vllm:num_requests_running{LABELS}"] == 0
    assert values[f"vllm:kv_cache_usage_perc{LABELS}"] == 0
    assert values[finished("abort")] == 1
    assert values[f"vllm:generation_tokens_total{LABELS}"] < 200
