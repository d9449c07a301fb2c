"""The request path for litellm deployments: try each target in order, price, record.

    Call ─▶ targets (primary, then fallbacks) ─▶ providers (litellm) ─▶ Usage + service tier
         ─▶ the target's price in force at the attempt's start ─▶ Cost ─▶ Record (durable)
         ─▶ the response, with kvgate's usage and cost

A failed attempt (connect error, timeout, 429, 5xx) is recorded and the next target is
tried as another attempt of the same interaction; a stream fails over only before its
first byte reached the client. As on the vLLM path, a stream's usage chunk and ``[DONE]``
go out only once its record is durable, and a stream the client abandons is recorded as
``cancelled`` with the tokens it had so far.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from starlette.responses import Response

from gateway.accounting.ledger import Ledger
from gateway.accounting.records import Record, Status
from gateway.api.calls import Endpoint, forwardable
from gateway.config import ProviderDeployment, ProviderTarget, Settings
from gateway.errors import InvalidRequest, error_body
from gateway.serving.context import Context
from gateway.serving.streaming import EventStream
from gateway.upstream import sse
from gateway.upstream.providers import (
    ProviderFailure,
    ProviderRequest,
    Providers,
    ProviderStream,
    now,
)
from gateway.usage import Usage, to_openai

log = logging.getLogger("kvgate.providers")
POLICY = "fallback"


@dataclass(slots=True)
class Attempt:
    """One try of a request on one target."""

    request_id: str
    number: int
    target: ProviderTarget
    started_at: datetime = field(default_factory=now)


class ProviderProxy:
    """Everything a litellm request needs, built once by the app's lifespan."""

    def __init__(
        self,
        *,
        providers: Providers,
        deployments: Mapping[str, ProviderDeployment],
        keys: Mapping[str, str],
        ledger: Ledger,
    ) -> None:
        self.providers = providers
        self.deployments = dict(deployments)
        self.keys = dict(keys)
        self.ledger = ledger

    # -- building blocks ------------------------------------------------------------------

    def _targets(self, ctx: Context) -> tuple[ProviderTarget, ...]:
        if ctx.call.endpoint is not Endpoint.CHAT:
            raise InvalidRequest(
                f"model '{ctx.call.model}' is served through a chat API only; "
                "use /v1/chat/completions",
                param="model",
            )
        # The vLLM path's limit, checked before litellm's own json gives up (about 1000
        # levels, as a connection error): the same body is refused the same way on both.
        forwardable(ctx.call.body)
        return self.deployments[ctx.deployment.name].targets

    def _start(self, ctx: Context, number: int, target: ProviderTarget) -> Attempt:
        request_id = ctx.request_id if number == 1 else f"{ctx.request_id}.{number}"
        return Attempt(request_id=request_id, number=number, target=target)

    def _request(self, ctx: Context, target: ProviderTarget) -> ProviderRequest:
        key = self.keys.get(target.api_key_env) if target.api_key_env else None
        return ProviderRequest(
            target=target, body=ctx.call.body, api_key=key, stream=ctx.call.stream
        )

    def make_record(
        self,
        ctx: Context,
        attempt: Attempt,
        *,
        status: Status,
        usage: Usage,
        first_token_at: datetime | None = None,
        finish_reason: str | None = None,
        service_tier: str | None = None,
        error: str | None = None,
    ) -> Record:
        """Price the attempt with its target's entry in force at its start, for its tier."""
        return self.ledger.record(
            request_id=attempt.request_id,
            attempt=attempt.number,
            principal=ctx.principal,
            interaction_id=ctx.interaction_id,
            deployment=ctx.deployment.name,
            bills_as=attempt.target.bills_as,
            upstream=attempt.target.litellm_model,
            policy=POLICY,
            stream=ctx.call.stream,
            started_at=attempt.started_at,
            status=status,
            usage=usage,
            first_token_at=first_token_at,
            finish_reason=finish_reason,
            error=error,
            service_tier=service_tier,
        )

    async def _fail(
        self, ctx: Context, attempt: Attempt, error: ProviderFailure, last: bool
    ) -> None:
        await self.ledger.keep(
            self.make_record(
                ctx, attempt, status=Status.FAILED, usage=Usage.missing(), error=error.message
            )
        )
        if last or not error.retryable:
            raise error

    # -- non-streaming ----------------------------------------------------------------------

    async def complete(self, ctx: Context) -> Response:
        targets = self._targets(ctx)
        for number, target in enumerate(targets, start=1):
            attempt = self._start(ctx, number, target)
            try:
                reply = await self.providers.complete(self._request(ctx, target))
            except ProviderFailure as exc:
                await self._fail(ctx, attempt, exc, last=number == len(targets))
                continue
            record = self.make_record(
                ctx,
                attempt,
                status=Status.COMPLETED,
                usage=reply.usage,
                finish_reason=reply.finish_reason,
                service_tier=reply.service_tier,
            )
            await self.ledger.keep(record)
            reply.body["usage"] = billed_usage(record)
            return Response(orjson.dumps(reply.body), media_type="application/json")
        raise AssertionError("unreachable: the last failure raises")

    # -- streaming --------------------------------------------------------------------------

    async def open_stream(self, ctx: Context) -> Response:
        """Open a stream on the first target that answers, then relay it."""
        targets = self._targets(ctx)
        for number, target in enumerate(targets, start=1):
            attempt = self._start(ctx, number, target)
            try:
                stream = await self.providers.open_stream(self._request(ctx, target))
            except ProviderFailure as exc:
                await self._fail(ctx, attempt, exc, last=number == len(targets))
                continue
            return EventStream(self._relay(ctx, attempt, stream))
        raise AssertionError("unreachable: the last failure raises")

    async def _relay(
        self, ctx: Context, attempt: Attempt, stream: ProviderStream
    ) -> AsyncGenerator[bytes, None]:
        error: ProviderFailure | None = None
        try:
            async for event in stream.events():
                yield event
        except ProviderFailure as exc:
            error = exc
        except BaseException:
            # The client went away: closing litellm's stream below cancels the provider call.
            self.ledger.keep_later(
                self.make_record(
                    ctx,
                    attempt,
                    status=Status.CANCELLED,
                    usage=stream.usage_so_far(),
                    first_token_at=stream.first_at,
                    finish_reason=stream.finish_reason,
                    service_tier=stream.service_tier,
                    error="client disconnected",
                )
            )
            raise
        finally:
            await stream.close()
        record = self.make_record(
            ctx,
            attempt,
            status=Status.FAILED if error else Status.COMPLETED,
            usage=stream.usage_so_far() if error else stream.usage(),
            first_token_at=stream.first_at,
            finish_reason=stream.finish_reason,
            service_tier=stream.service_tier,
            error=error.message if error else None,
        )
        await self.ledger.keep(record)
        if error is not None:
            yield b"data: " + error_body(error.message, error.type, code=error.code) + b"\n\n"
            return
        if ctx.call.client_wants_usage:
            chunk = dict(stream.usage_chunk or {"object": "chat.completion.chunk"})
            chunk["choices"] = []
            chunk["usage"] = billed_usage(record)
            yield sse.encode(chunk)
        yield sse.DONE + b"\n\n"


async def build_provider_proxy(
    settings: Settings, deployments: Mapping[str, Any], ledger: Ledger
) -> ProviderProxy | None:
    """The litellm path, sharing the vLLM path's ledger; None if no model uses it."""
    chosen = {n: d for n, d in deployments.items() if isinstance(d, ProviderDeployment)}
    if not chosen:
        return None
    providers = Providers()
    await asyncio.to_thread(providers.load)
    log.info("litellm %s loaded for %d model(s)", providers.version, len(chosen))
    return ProviderProxy(
        providers=providers,
        deployments=chosen,
        keys=settings.provider_keys(),
        ledger=ledger,
    )


def billed_usage(record: Record) -> dict[str, Any]:
    """OpenAI's usage shape from the record's classes, with writes and kvgate's cost."""
    usage = to_openai(record.usage)
    usage["prompt_tokens_details"]["cache_write_tokens"] = record.usage.cache_write_tokens
    usage["cost"] = f"{record.cost.total:f}" if record.priced else None
    usage["usage_source"] = record.usage.source.value
    return usage
