"""The simulated replica over HTTP: vLLM's OpenAI-compatible server, on aiohttp.

aiohttp rather than the gateway's FastAPI: the overhead benchmark sends traffic straight
here with `TimingModel.zero()`, so the simulator must cost far less than what it measures.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``,
``POST /v1/responses``, ``POST /v1/messages``, ``POST /v1/messages/count_tokens``,
``GET /v1/models``, ``GET /health``, ``POST /tokenize``, ``GET /metrics``,
``POST /reset_prefix_cache``. The wires other than chat's are in wires.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from gateway.routing.tiers import MEDIA, SOURCES
from gateway.tools.sim.engine import FINISH_LENGTH, Engine, Generation, GenerationRequest
from gateway.tools.sim.events import CacheEvents, EventPublisher, KvEventsConfig
from gateway.tools.sim.metrics import render_metrics
from gateway.tools.sim.protocol import (
    DONE_EVENT,
    ApiError,
    BadRequest,
    ParsedRequest,
    Reply,
    chat_prompt,
    check_model,
    completion_prompt,
    parse_generation,
    parse_json,
    usage,
)
from gateway.tools.sim.timing import TimingModel
from gateway.tools.sim.wires import (
    ResponseReply,
    ResponseStore,
    Stored,
    anthropic_error,
    anthropic_event,
    anthropic_usage,
    chat_tokens,
    embeddings_body,
    messages_prompt,
    responses_prompt,
    responses_usage,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything that makes one simulated replica."""

    model: str = "kvgate/demo-llama-8b"
    block_size: int = 16
    capacity_blocks: int = 2048
    timing: TimingModel = field(default_factory=TimingModel)
    seed: int = 0
    max_model_len: int = 32_768
    # vLLM caches the blocks that output tokens fill; off, only prompt blocks are kept.
    cache_output_blocks: bool = True
    # Publish KV events as vLLM does (--kv-events-config); None: no events.
    kv_events: KvEventsConfig | None = None
    # Lower tiers: blocks of host memory, then of disk, that keep what GPU memory evicts
    # (their load times per block are the timing model's); 0: no such tier.
    cpu_blocks: int = 0
    disk_blocks: int = 0

    def __post_init__(self) -> None:
        if self.cpu_blocks < 0 or self.disk_blocks < 0:
            raise ValueError("cpu_blocks and disk_blocks must be 0 or more")
        if self.disk_blocks and not self.cpu_blocks:
            raise ValueError("a disk tier needs a CPU tier above it (cpu_blocks)")

    @property
    def lower_blocks(self) -> tuple[int, ...]:
        """The lower tiers' capacities, host memory first."""
        return tuple(b for b in (self.cpu_blocks, self.disk_blocks) if b)


class Replica:
    """The HTTP face of one engine."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(
            block_size=config.block_size,
            capacity_blocks=config.capacity_blocks,
            timing=config.timing,
            seed=config.seed,
            cache_output_blocks=config.cache_output_blocks,
            lower_blocks=config.lower_blocks,
        )
        self.created = int(time.time())
        self.stored = ResponseStore()

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        body = parse_json(await request.read())
        parsed = parse_generation(body, chat_prompt(body), max_model_len=self.config.max_model_len)
        check_model(body, self.config.model)
        return await self._generate(request, parsed, self._reply(request, chat=True))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions."""
        body = parse_json(await request.read())
        prompt = completion_prompt(body)
        parsed = parse_generation(body, prompt, max_model_len=self.config.max_model_len)
        check_model(body, self.config.model)
        return await self._generate(request, parsed, self._reply(request, chat=False))

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/embeddings."""
        body = parse_json(await request.read())
        check_model(body, self.config.model)
        salt = body.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
        return web.Response(
            body=embeddings_body(self.config.model, body), content_type="application/json"
        )

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/responses: stored (``store``, the default) for follow-ups."""
        body = parse_json(await request.read())
        messages = responses_prompt(body, self.stored)
        options = {
            "max_tokens": body.get("max_output_tokens"),
            "stream": body.get("stream"),
            "cache_salt": body.get("cache_salt"),
        }
        parsed = parse_generation(
            options, chat_tokens(messages), max_model_len=self.config.max_model_len
        )
        check_model(body, self.config.model)
        reply = ResponseReply("resp_" + uuid.uuid4().hex, self.config.model, body, int(time.time()))
        job = GenerationRequest(parsed.prompt_token_ids, parsed.max_tokens, parsed.cache_salt)
        store = body.get("store", True) is not False
        if parsed.stream:
            response = await _event_stream(request)
            async with self.engine.run(job) as generation:
                await response.write(reply.opening())
                parts: list[str] = []
                async for batch in generation.batches():
                    parts.extend(token.text for token in batch)
                    await response.write(b"".join(reply.delta(t.text) for t in batch))
                text = "".join(parts)
                usage = responses_usage(
                    generation.prompt_tokens, generation.completion_tokens, generation.cached_tokens
                )
                if store:
                    self.stored.put(reply.id, Stored(messages, text))
                await response.write(reply.closing(text, usage))
            await response.write_eof()
            return response
        async with self.engine.run(job) as generation:
            text = await generation.text()
        if store:
            self.stored.put(reply.id, Stored(messages, text))
        usage = responses_usage(
            generation.prompt_tokens, generation.completion_tokens, generation.cached_tokens
        )
        return _json(reply.response("incomplete", text, usage))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/messages (Anthropic's wire, as vLLM serves it)."""
        body = parse_json(await request.read())
        options = {
            "max_tokens": body.get("max_tokens"),
            "stream": body.get("stream"),
            "cache_salt": body.get("cache_salt"),
        }
        if options["max_tokens"] is None:
            raise BadRequest("'max_tokens' is required")
        parsed = parse_generation(
            options, messages_prompt(body), max_model_len=self.config.max_model_len
        )
        check_model(body, self.config.model)
        message_id = "msg_" + uuid.uuid4().hex
        job = GenerationRequest(parsed.prompt_token_ids, parsed.max_tokens, parsed.cache_salt)
        envelope = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": self.config.model,
        }
        if not parsed.stream:
            async with self.engine.run(job) as generation:
                text = await generation.text()
            usage = anthropic_usage(
                generation.prompt_tokens, generation.completion_tokens, generation.cached_tokens
            )
            answer = {
                **envelope,
                "content": [{"type": "text", "text": text}],
                "stop_reason": "max_tokens",
                "stop_sequence": None,
                "usage": usage,
            }
            return _json(answer)
        response = await _event_stream(request)
        async with self.engine.run(job) as generation:
            start = anthropic_usage(generation.prompt_tokens, 0, generation.cached_tokens)
            message: dict[str, Any] = {
                **envelope,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
            }
            opening = [
                anthropic_event("message_start", {"message": {**message, "usage": start}}),
                anthropic_event(
                    "content_block_start",
                    {"index": 0, "content_block": {"type": "text", "text": ""}},
                ),
            ]
            await response.write(b"".join(opening))
            async for batch in generation.batches():
                deltas = [
                    anthropic_event(
                        "content_block_delta",
                        {"index": 0, "delta": {"type": "text_delta", "text": token.text}},
                    )
                    for token in batch
                ]
                await response.write(b"".join(deltas))
            usage = anthropic_usage(
                generation.prompt_tokens, generation.completion_tokens, generation.cached_tokens
            )
            closing = [
                anthropic_event("content_block_stop", {"index": 0}),
                anthropic_event(
                    "message_delta",
                    {"delta": {"stop_reason": "max_tokens", "stop_sequence": None}, "usage": usage},
                ),
                anthropic_event("message_stop", {}),
            ]
            await response.write(b"".join(closing))
        await response.write_eof()
        return response

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/messages/count_tokens."""
        body = parse_json(await request.read())
        tokens = messages_prompt(body)
        check_model(body, self.config.model)
        count = len(tokens)
        return _json(
            {"input_tokens": count, "context_management": {"original_input_tokens": count}}
        )

    async def models(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/models."""
        model = {
            "id": self.config.model,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
        }
        return _json({"object": "list", "data": [model]})

    async def health(self, request: web.Request) -> web.StreamResponse:
        """GET /health: 200 with an empty body while the engine runs."""
        return web.Response()

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        """POST /tokenize: a prompt or chat messages to token ids."""
        body = parse_json(await request.read())
        if "messages" in body:
            add = body.get("add_generation_prompt", True)
            if not isinstance(add, bool):
                raise BadRequest("'add_generation_prompt' must be of type bool")
            tokens = chat_prompt(body, add_generation_prompt=add)
        elif isinstance(body.get("prompt"), str):
            tokens = completion_prompt(body)
        else:
            raise BadRequest("Either 'prompt' (a string) or 'messages' is required")
        check_model(body, self.config.model)
        limit = self.config.max_model_len
        return _json(
            {"count": len(tokens), "max_model_len": limit, "tokens": tokens, "token_strs": None}
        )

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        """GET /metrics in Prometheus text format."""
        text = render_metrics(self.engine, self.config.model)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def reset_prefix_cache(self, request: web.Request) -> web.StreamResponse:
        """POST /reset_prefix_cache: drop every cached block no running request holds."""
        self.engine.reset_prefix_cache()
        return web.Response()

    def _reply(self, request: web.Request, *, chat: bool) -> Reply:
        # vLLM names the response after the caller's X-Request-Id when one is given.
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        prefix = "chatcmpl-" if chat else "cmpl-"
        return Reply(prefix + base, int(time.time()), self.config.model, chat)

    async def _generate(
        self, request: web.Request, parsed: ParsedRequest, reply: Reply
    ) -> web.StreamResponse:
        job = GenerationRequest(parsed.prompt_token_ids, parsed.max_tokens, parsed.cache_salt)
        if parsed.stream:
            return await self._stream(request, parsed, job, reply)
        async with self.engine.run(job) as generation:
            text = await generation.text()
        # The simulator only ever stops at the length limit.
        body = reply.body(text, FINISH_LENGTH, _usage(generation))
        return web.Response(body=body, content_type="application/json")

    async def _stream(
        self, request: web.Request, parsed: ParsedRequest, job: GenerationRequest, reply: Reply
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Cache-Control": "no-cache"})
        response.content_type = "text/event-stream"
        await response.prepare(request)
        include_usage = parsed.include_usage
        async with self.engine.run(job) as generation:
            first = reply.chat
            async for batch in generation.batches():
                # One write per batch: with instant decode the whole answer is one write.
                events: list[bytes] = []
                if first:
                    events.append(reply.role_event(include_usage))
                    first = False
                done = generation.completion_tokens == parsed.max_tokens
                last = len(batch) - 1
                for index, token in enumerate(batch):
                    finish = FINISH_LENGTH if done and index == last else None
                    events.append(reply.token_event(token.text, finish, include_usage))
                if done and include_usage:
                    events.append(reply.usage_event(_usage(generation)))
                if done:
                    events.append(DONE_EVENT)
                await response.write(b"".join(events))
        await response.write_eof()
        return response


# The replica behind an app, for in-process tests that look at its cache.
REPLICA = web.AppKey("replica", Replica)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bad input becomes vLLM's error JSON, mapped here once."""
    try:
        return await handler(request)
    except ApiError as error:
        # vLLM's /v1/messages answers in Anthropic's error shape.
        body = anthropic_error(error) if request.path.startswith("/v1/messages") else error.body()
        return web.Response(body=body, status=error.status, content_type="application/json")


def create_app(config: SimConfig) -> web.Application:
    """The aiohttp application of one simulated replica."""
    replica = Replica(config)
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
    app[REPLICA] = replica
    if config.kv_events is not None:
        app.cleanup_ctx.append(_publishing(replica, config.kv_events))
    app.add_routes(
        [
            web.post("/v1/chat/completions", replica.chat_completions),
            web.post("/v1/completions", replica.completions),
            web.post("/v1/embeddings", replica.embeddings),
            web.post("/v1/responses", replica.responses),
            web.post("/v1/messages", replica.messages),
            web.post("/v1/messages/count_tokens", replica.count_tokens),
            web.get("/v1/models", replica.models),
            web.get("/health", replica.health),
            web.post("/tokenize", replica.tokenize),
            web.get("/metrics", replica.metrics),
            web.post("/reset_prefix_cache", replica.reset_prefix_cache),
        ]
    )
    return app


def _publishing(
    replica: Replica, kv_events: KvEventsConfig
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The KV event publisher's life: with the app's loop, from start-up to clean-up."""

    async def publish(app: web.Application) -> AsyncIterator[None]:
        publisher = EventPublisher(kv_events)
        publisher.start()
        replica.engine.events = CacheEvents(publisher, replica.config.block_size)
        try:
            yield
        finally:
            replica.engine.events = None
            await publisher.close()

    return publish


def serve(config: SimConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run one simulated replica until SIGINT or SIGTERM, then shut down gracefully."""
    print(f"kvgate sim: {config.model} on http://{host}:{port}", flush=True)
    web.run_app(
        create_app(config),
        host=host,
        port=port,
        # Per-request logging would cost more than the simulated request itself.
        access_log=None,
        # vLLM aborts a request whose client went away; cancelling the handler does that.
        handler_cancellation=True,
        shutdown_timeout=5.0,
        print=None,
    )


def _usage(generation: Generation) -> dict[str, Any]:
    by_source = None
    if generation.engine.cache.lower_capacity:
        by_source = {
            SOURCES[medium]: tokens
            for medium, tokens in zip(MEDIA, generation.cached_by_tier, strict=True)
        }
    return usage(
        generation.prompt_tokens,
        generation.completion_tokens,
        generation.cached_tokens,
        by_source,
    )


async def _event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Cache-Control": "no-cache"})
    response.content_type = "text/event-stream"
    await response.prepare(request)
    return response


def _json(value: object) -> web.Response:
    return web.Response(body=orjson.dumps(value), content_type="application/json")
