"""The request path for vLLM deployments: choose a replica, call it, price, record.

    Call ─▶ upstream body (model, cache_salt, include_usage) ─▶ fleet.choose
         ─▶ aiohttp call (one failover on connect errors, as a new attempt)
         ─▶ Usage ─▶ price in force at the attempt's start ─▶ Cost ─▶ Record (durable)
         ─▶ the upstream's response, with usage.cost added, last

Streams pass through event by event; the usage-only chunk and ``[DONE]`` are held back
until the record is durable, so a client that saw a stream finish always has its record.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp
import orjson
from starlette.responses import Response

from gateway.accounting.ledger import Ledger
from gateway.accounting.records import Record, Status
from gateway.api.calls import forwardable
from gateway.auth import cache_salt
from gateway.config import Deployment
from gateway.errors import (
    KvgateError,
    UpstreamError,
    UpstreamRejected,
    UpstreamUnavailable,
    error_body,
)
from gateway.routing.fleet import Fleet, Placement, Replica, Route
from gateway.serving.context import Context, now
from gateway.serving.streaming import EventStream
from gateway.upstream import sse
from gateway.upstream.vllm import UpstreamConnectError, UpstreamStream, post_json
from gateway.usage import Usage, UsageSource, from_openai

log = logging.getLogger("kvgate.proxy")
MAX_ATTEMPTS = 2
CHARS_PER_TOKEN = 4  # only for estimates when an upstream reported no usage


@dataclass(slots=True)
class Attempt:
    """One try of a request on one replica."""

    request_id: str
    number: int
    route: Route
    placement: Placement
    started_at: datetime = field(default_factory=now)

    @property
    def replica(self) -> Replica:
        return self.placement.replica


class Proxy:
    """Everything a vLLM request needs, built once by the app's lifespan."""

    def __init__(
        self,
        *,
        secret: str,
        session: aiohttp.ClientSession,
        fleets: dict[str, Fleet],
        ledger: Ledger,
    ) -> None:
        self.secret = secret
        self.session = session
        self.fleets = fleets
        self.ledger = ledger
        self._timeouts: dict[str, aiohttp.ClientTimeout] = {}

    # -- building blocks ------------------------------------------------------------------

    async def prepare(self, ctx: Context) -> tuple[bytes, Route]:
        """The upstream body (served model name, tenant salt, usage asked for) and the
        request's route (its salted block hashes), both computed once for every attempt."""
        call = ctx.call
        salt = cache_salt(self.secret, ctx.principal.cache_scope, call.client_salt)
        body = dict(call.body)
        body["model"] = ctx.deployment.served_name
        body["cache_salt"] = salt
        if call.stream:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        encoded = forwardable(body)
        route = await self.fleets[ctx.deployment.name].route_async(
            call, cache_salt=salt, request_id=ctx.request_id, interaction_id=ctx.interaction_id
        )
        # Every attempt sends ``encoded``: the parsed body, as large as the request, goes now
        # instead of being held beside it until the upstream answers (issue 14 item 8).
        call.body.clear()
        return encoded, route

    def _timeout(self, deployment: Deployment) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(deployment.name)
        if timeout is None:
            timeout = self._timeouts[deployment.name] = aiohttp.ClientTimeout(
                total=deployment.timeout_s, sock_connect=deployment.connect_timeout_s
            )
        return timeout

    async def _start(self, ctx: Context, route: Route, number: int, tried: set[str]) -> Attempt:
        request_id = ctx.request_id if number == 1 else f"{ctx.request_id}.{number}"
        try:
            placement = self.fleets[ctx.deployment.name].place(route, exclude=frozenset(tried))
        except UpstreamUnavailable as exc:
            # No replica to try (all down): the refusal is still a failed attempt on record.
            await self._keep_unplaced(ctx, request_id, number, exc)
            raise
        tried.add(placement.replica.url)
        return Attempt(request_id=request_id, number=number, route=route, placement=placement)

    async def _keep_unplaced(
        self, ctx: Context, request_id: str, number: int, error: KvgateError
    ) -> None:
        await self.ledger.keep(
            self.ledger.record(
                request_id=request_id,
                attempt=number,
                principal=ctx.principal,
                interaction_id=ctx.interaction_id,
                deployment=ctx.deployment.name,
                bills_as=ctx.deployment.bills_as,
                upstream="",
                policy=ctx.deployment.policy,
                stream=ctx.call.stream,
                started_at=now(),
                status=Status.FAILED,
                usage=Usage.missing(),
                error=error.message,
            )
        )

    def _end(self, ctx: Context, attempt: Attempt) -> None:
        self.fleets[ctx.deployment.name].finish(attempt.placement)

    def make_record(
        self,
        ctx: Context,
        attempt: Attempt,
        *,
        status: Status,
        usage: Usage,
        first_token_at: datetime | None = None,
        finish_reason: str | None = None,
        error: str | None = None,
    ) -> Record:
        """Price the attempt with the entry in force at its start; note what routing expected."""
        fleet = self.fleets[ctx.deployment.name]
        predicted = ceiling = None
        if usage.source is UsageSource.REPORTED:
            prompt_tokens = usage.prompt_tokens
            predicted = fleet.predicted_tokens(attempt.route, attempt.placement, prompt_tokens)
            ceiling = fleet.ceiling_tokens(attempt.route, prompt_tokens)
            if status is Status.COMPLETED:
                fleet.learn(
                    attempt.route,
                    attempt.placement,
                    cached_tokens=usage.cache_read_tokens,
                    prompt_tokens=prompt_tokens,
                )
        return self.ledger.record(
            request_id=attempt.request_id,
            attempt=attempt.number,
            principal=ctx.principal,
            interaction_id=ctx.interaction_id,
            deployment=ctx.deployment.name,
            bills_as=ctx.deployment.bills_as,
            upstream=attempt.replica.url,
            policy=ctx.deployment.policy,
            stream=ctx.call.stream,
            started_at=attempt.started_at,
            status=status,
            usage=usage,
            first_token_at=first_token_at,
            finish_reason=finish_reason,
            error=error,
            predicted_cached_tokens=predicted,
            ceiling_cached_tokens=ceiling,
        )

    async def _fail(self, ctx: Context, attempt: Attempt, error: KvgateError) -> None:
        await self.ledger.keep(
            self.make_record(
                ctx, attempt, status=Status.FAILED, usage=Usage.missing(), error=error.message
            )
        )

    # -- non-streaming ----------------------------------------------------------------------

    async def complete(self, ctx: Context) -> Response:
        (body, route), tried = await self.prepare(ctx), set[str]()
        fleet = self.fleets[ctx.deployment.name]
        for number in range(1, MAX_ATTEMPTS + 1):
            attempt = await self._start(ctx, route, number, tried)
            url = attempt.replica.url + ctx.call.endpoint.value
            try:
                reply = await post_json(
                    self.session, url, body, timeout=self._timeout(ctx.deployment)
                )
            except UpstreamConnectError as exc:
                fleet.mark_down(attempt.replica)
                await self._fail(ctx, attempt, exc)
                if number == MAX_ATTEMPTS or not fleet.has_alternative(tried):
                    raise UpstreamUnavailable(exc.message) from exc
                continue
            except UpstreamError as exc:
                await self._fail(ctx, attempt, exc)
                raise
            finally:
                self._end(ctx, attempt)
            return await self._finish(ctx, attempt, reply.status, reply.body)
        raise AssertionError("unreachable")

    async def _finish(self, ctx: Context, attempt: Attempt, status: int, raw: bytes) -> Response:
        data = _json_object(raw)
        if status != 200 or data is None:
            error = _upstream_error(status, data, raw)
            await self._fail(ctx, attempt, error)
            raise error
        usage = from_openai(_dict(data.get("usage")))
        record = self.make_record(
            ctx,
            attempt,
            status=Status.COMPLETED,
            usage=usage,
            first_token_at=None,
            finish_reason=_finish_reason(data.get("choices")),
        )
        await self.ledger.keep(record)
        data["usage"] = _billed_usage(data.get("usage"), record)
        return Response(orjson.dumps(data), media_type="application/json")

    # -- streaming --------------------------------------------------------------------------

    async def open_stream(self, ctx: Context) -> Response:
        """Connect (with failover) and answer with a stream, or with the upstream's error."""
        (body, route), tried = await self.prepare(ctx), set[str]()
        fleet = self.fleets[ctx.deployment.name]
        for number in range(1, MAX_ATTEMPTS + 1):
            attempt = await self._start(ctx, route, number, tried)
            url = attempt.replica.url + ctx.call.endpoint.value
            upstream = UpstreamStream(self.session, url, body, self._timeout(ctx.deployment))
            try:
                status = await upstream.open()
            except UpstreamConnectError as exc:
                self._end(ctx, attempt)
                fleet.mark_down(attempt.replica)
                await self._fail(ctx, attempt, exc)
                if number == MAX_ATTEMPTS or not fleet.has_alternative(tried):
                    raise UpstreamUnavailable(exc.message) from exc
                continue
            except UpstreamError as exc:
                self._end(ctx, attempt)
                await self._fail(ctx, attempt, exc)
                raise
            if status != 200:
                raw = await upstream.read_all()
                await upstream.close()
                self._end(ctx, attempt)
                return await self._finish(ctx, attempt, status, raw)
            return EventStream(self._relay(ctx, attempt, upstream))
        raise AssertionError("unreachable")

    async def _relay(
        self, ctx: Context, attempt: Attempt, upstream: UpstreamStream
    ) -> AsyncGenerator[bytes, None]:
        state, splitter = sse.StreamState(), sse.EventSplitter()
        fleet = self.fleets[ctx.deployment.name]
        first_token_at: datetime | None = None
        usage_chunk: dict[str, Any] | None = None
        error: UpstreamError | None = None
        try:
            async for data in upstream.chunks():
                # The events of one read go out together, at once: one send per read,
                # not per event (a token stream can bring many events in one read).
                passing: list[bytes] = []
                for event in splitter.feed(data):
                    if first_token_at is None:
                        first_token_at = now()
                        fleet.first_token(attempt.placement)
                    held = sse.inspect(event, state)
                    if held is not None:
                        usage_chunk = held
                    elif not state.saw_done:
                        passing.append(event)
                if passing:
                    yield b"".join(passing)
        except UpstreamError as exc:
            error = exc
        except BaseException:
            # The client went away: the upstream request is cancelled by closing it below.
            self.ledger.keep_later(
                self._stream_record(
                    ctx, attempt, state, first_token_at, Status.CANCELLED, "client disconnected"
                )
            )
            raise
        finally:
            await upstream.close()
            fleet.finish(attempt.placement)
        if error is None and not state.saw_done:
            error = UpstreamError("upstream stream ended before [DONE]")
        status = Status.FAILED if error else Status.COMPLETED
        record = self._stream_record(
            ctx, attempt, state, first_token_at, status, error.message if error else None
        )
        await self.ledger.keep(record)
        if error is not None:
            yield b"data: " + error_body(error.message, error.type, code=error.code) + b"\n\n"
            return
        if ctx.call.client_wants_usage and usage_chunk is not None:
            usage_chunk["usage"] = _billed_usage(usage_chunk.get("usage"), record)
            yield sse.encode(usage_chunk)
        yield sse.DONE + b"\n\n"

    def _stream_record(
        self,
        ctx: Context,
        attempt: Attempt,
        state: sse.StreamState,
        first_token_at: datetime | None,
        status: Status,
        error: str | None,
    ) -> Record:
        if state.usage is not None:
            usage = from_openai(state.usage)
        else:
            # No usage chunk: the stream ended early. Estimate, and say so.
            usage = Usage(
                uncached_tokens=ctx.call.prompt_chars // CHARS_PER_TOKEN,
                output_tokens=state.content_events,
                source=UsageSource.ESTIMATED,
            )
        return self.make_record(
            ctx,
            attempt,
            status=status,
            usage=usage,
            first_token_at=first_token_at,
            finish_reason=state.finish_reason,
            error=error,
        )


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _upstream_error(status: int, data: dict[str, Any] | None, raw: bytes) -> KvgateError:
    """A 4xx with a JSON body is the client's fault, said with the same status in the
    gateway's error shape (vLLM's own has an integer code); anything else is the upstream's."""
    error = data.get("error") if data is not None else None
    detail = error if isinstance(error, dict) else data or {}
    message = detail.get("message")
    if 400 <= status < 500 and data is not None:
        param = detail.get("param")
        return UpstreamRejected(
            status,
            str(message or f"upstream answered {status}"),
            param=param if isinstance(param, str) else None,
        )
    return UpstreamError(f"upstream answered {status}: {message or raw[:200]!r}")


def _dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _finish_reason(choices: Any) -> str | None:
    """The first choice's finish reason, if the upstream's answer has one where expected."""
    first = choices[0] if isinstance(choices, list) and choices else None
    reason = first.get("finish_reason") if isinstance(first, dict) else None
    return str(reason) if reason is not None else None


def _billed_usage(usage: Any, record: Record) -> dict[str, Any]:
    """The upstream's usage with cached tokens always present and the cost added."""
    billed = dict(usage) if isinstance(usage, dict) else {}
    details = billed.get("prompt_tokens_details")
    details = dict(details) if isinstance(details, dict) else {}
    details.setdefault("cached_tokens", record.usage.cache_read_tokens)
    if details["cached_tokens"] is None:
        details["cached_tokens"] = record.usage.cache_read_tokens
    billed["prompt_tokens_details"] = details
    billed["cost"] = f"{record.cost.total:f}" if record.priced else None
    return billed
