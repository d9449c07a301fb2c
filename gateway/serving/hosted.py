"""The hosted backend: each deployment's targets, tried in order.

    plan     the deployment's targets (primary, then fallbacks) that speak the endpoint,
             one attempt each; none: a 400 naming the endpoints the deployment serves
    send     the provider's own wire (gateway/serving/passthrough.py) where it speaks
             the endpoint's: chat and completions for OpenAI-wire providers
             (gateway/serving/chatwire.py), Responses, embeddings, Messages; else (chat
             of Anthropic, Gemini, Bedrock, Vertex…, or a target with ``via: litellm``)
             litellm's completion, its usage normalised (``gateway.usage.from_litellm``);
             Messages to a target that does not speak Anthropic's wire is translated
             into that chat and back (gateway/serving/translated.py), billed as the chat
    open     the provider's own event stream, open once it answered 200; or litellm's
             stream, its first chunk read before the client sees a byte, so a provider
             that fails at once fails over like a non-streamed call

A failed attempt (connect error, timeout, 429, 5xx) is recorded and the next target is
tried as another attempt of the same interaction. A target whose connection failed before
any byte of a reply (refused, or reset: most often a kept-alive connection the provider had
closed) is tried once more, as the next attempt, before the one after it: nothing reached
the client, and a new connection usually answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

from gateway.accounting.records import Record, Status
from gateway.config import ProviderDeployment, ProviderTarget, Settings
from gateway.errors import InvalidRequest, KvgateError
from gateway.serving import replies
from gateway.serving.backend import Answer
from gateway.serving.bases import speaks_chat
from gateway.serving.calls import Call, Endpoint, forwardable, served, speaks, translates
from gateway.serving.chatwire import ProviderChatStream
from gateway.serving.context import NO_EXPECTATION, Attempt, Context, Expectation, Outcome
from gateway.serving.passthrough import Passthrough, Prepared
from gateway.serving.translated import TranslatedStream, Translation
from gateway.serving.wires import WireStream
from gateway.upstream.providers import ProviderRequest, Providers, ProviderStream
from gateway.upstream.vllm import UpstreamConnectError

log = logging.getLogger("kvgate.providers")
POLICY = "fallback"


@dataclass(slots=True)
class Plan:
    """The targets of one request, in the order they are tried, and the target of each
    attempt: each target once, one that could not be reached twice in a row."""

    targets: tuple[ProviderTarget, ...]
    tries: list[int] = field(init=False)  # attempt n goes to targets[tries[n - 1]]
    # Each target's request on its own wire, built once (a retry sends the same bytes).
    prepared: dict[int, Prepared] = field(init=False)

    def __post_init__(self) -> None:
        self.tries = list(range(len(self.targets)))
        self.prepared = {}

    def target(self, number: int) -> ProviderTarget:
        """The target of attempt ``number``."""
        return self.targets[self.tries[number - 1]]

    def request(self, call: Call, number: int, passthrough: Passthrough) -> Prepared:
        """Attempt ``number``'s request on its target's own wire. Once every target's is
        built, the client's parsed body is needed no more: it goes, instead of being held
        beside the bytes sent until the provider answers (a large body is not held twice)."""
        index = self.tries[number - 1]
        prepared = self.prepared.get(index)
        if prepared is None:
            prepared = self.prepared[index] = passthrough.request(call, self.targets[index])
            if len(self.prepared) == len(self.targets):
                call.body.clear()
        return prepared

    def again(self, number: int) -> None:
        """Attempt ``number``'s target is tried once more, as the next attempt (once)."""
        tried = self.tries[number - 1]
        if self.tries.count(tried) == 1:
            self.tries.insert(number, tried)


class HostedBackend:
    """Serves every litellm deployment; built once by the app's lifespan."""

    def __init__(
        self,
        *,
        providers: Providers,
        deployments: Mapping[str, ProviderDeployment],
        keys: Mapping[str, str],
        session: aiohttp.ClientSession,
    ) -> None:
        self.providers = providers
        self.deployments = dict(deployments)
        self.keys = dict(keys)
        self.passthrough = Passthrough(session, keys)
        self.translation = Translation(providers)

    async def plan(self, ctx: Context) -> Plan:
        """The deployment's targets that speak the call's endpoint, in their order."""
        deployment, endpoint = self.deployments[ctx.deployment.name], ctx.call.endpoint
        targets = tuple(t for t in deployment.targets if endpoint in speaks(t))
        if not targets:
            raise InvalidRequest(
                f"model '{ctx.call.model}' is not served on {endpoint.value}; it is served "
                f"on {', '.join(served(deployment))}",
                param="model",
            )
        # The vLLM path's limit, checked before litellm's own json gives up (about 1000
        # levels, as a connection error): the same body is refused the same way on both.
        forwardable(ctx.call.body)
        return Plan(targets)

    def start(self, ctx: Context, plan: Plan, number: int) -> Attempt:
        """Attempt ``number`` goes to its target in the plan."""
        target = plan.target(number)
        return Attempt(
            request_id=ctx.attempt_id(number),
            number=number,
            upstream=target.litellm_model,
            bills_as=target.bills_as,
            policy=POLICY,
            hold=target,
        )

    def _request(self, call: Call, target: ProviderTarget) -> ProviderRequest:
        key = self.keys.get(target.api_key_env) if target.api_key_env else None
        return ProviderRequest(
            target=target,
            body=call.body,
            api_key=key,
            stream=call.stream,
            body_bytes=call.body_bytes,
        )

    async def send(self, ctx: Context, plan: Plan, attempt: Attempt) -> Answer:
        """One call on the provider's own wire, one litellm completion, or Messages as chat."""
        target = _target(attempt)
        try:
            if translates(target, ctx.call.endpoint):
                await self.translation.ready()
                return await self.translation.send(ctx.call, target, self._send)
            if _same_wire(ctx.call, target):
                prepared = plan.request(ctx.call, attempt.number, self.passthrough)
                return await self.passthrough.send(ctx.call, target, prepared)
            return await self._send(ctx.call, target)
        except KvgateError as error:
            _unreached(plan, attempt, error)
            raise

    async def _send(self, call: Call, target: ProviderTarget) -> Answer:
        if _same_wire(call, target):
            return await self.passthrough.send(call, target)
        reply = await self.providers.complete(self._request(call, target))
        return Answer(
            body=reply.body,
            upstream_usage=reply.raw_usage,
            outcome=Outcome(
                status=Status.COMPLETED,
                usage=reply.usage,
                finish_reason=reply.finish_reason,
                service_tier=reply.service_tier,
            ),
        )

    async def open(
        self, ctx: Context, plan: Plan, attempt: Attempt
    ) -> HostedStream | WireStream | ProviderChatStream | TranslatedStream:
        """The provider's own stream; one litellm stream, its first chunk already read; or
        either of those as Messages events."""
        target = _target(attempt)
        try:
            if translates(target, ctx.call.endpoint):
                await self.translation.ready()
                return await self.translation.open(ctx.call, target, self._open)
            if _same_wire(ctx.call, target):
                prepared = plan.request(ctx.call, attempt.number, self.passthrough)
                return await self.passthrough.open(ctx.call, target, prepared)
            return await self._open(ctx.call, target)
        except KvgateError as error:
            _unreached(plan, attempt, error)
            raise

    async def _open(
        self, call: Call, target: ProviderTarget
    ) -> HostedStream | WireStream | ProviderChatStream:
        if _same_wire(call, target):
            return await self.passthrough.open(call, target)
        return HostedStream(await self.providers.open_stream(self._request(call, target)))

    def first_token(self, attempt: Attempt) -> None:
        """Nothing to tell: providers do their own scheduling."""

    def learn(self, plan: Plan, attempt: Attempt, outcome: Outcome) -> Expectation:
        """Hosted caches are the providers' own: nothing to predict."""
        return NO_EXPECTATION

    def release(self, attempt: Attempt) -> None:
        """Nothing is held per attempt."""

    def can_retry(self, plan: Plan, attempt: Attempt) -> bool:
        """Another attempt is planned: the next target, or this one once more."""
        return attempt.number < len(plan.tries)

    def exhausted(self, error: KvgateError) -> KvgateError:
        """The last target's failure, as the provider answered."""
        return error


def _same_wire(call: Call, target: ProviderTarget) -> bool:
    """Whether the call goes over the provider's own wire (everything but litellm's chat)."""
    return call.endpoint is not Endpoint.CHAT or speaks_chat(target)


def _unreached(plan: Plan, attempt: Attempt, error: KvgateError) -> None:
    """A connection that failed before any byte of a reply is worth once more on the same
    target: the provider had most likely closed a kept-alive connection."""
    cause = error if isinstance(error, UpstreamConnectError) else error.__cause__
    if isinstance(cause, UpstreamConnectError) and not cause.answered:
        plan.again(attempt.number)


def _target(attempt: Attempt) -> ProviderTarget:
    target = attempt.hold
    assert isinstance(target, ProviderTarget)
    return target


class HostedStream:
    """A litellm stream as OpenAI SSE events; its usage is known once it has ended."""

    def __init__(self, stream: ProviderStream) -> None:
        self.stream = stream

    @property
    def first_token_at(self) -> datetime | None:
        """When the first chunk arrived (read before the stream was handed on)."""
        return self.stream.first_at

    @property
    def usage_chunk(self) -> dict[str, Any] | None:
        """The provider's usage-only chunk, held back."""
        return self.stream.usage_chunk

    def events(self) -> AsyncIterator[bytes]:
        """Each content chunk as one ``data:`` event."""
        return self.stream.events()

    def outcome(self, *, ended: bool, error: str | None) -> Outcome:
        """Reported usage of a finished stream; the tokens so far of one that was not."""
        stream = self.stream
        return Outcome(
            status=Status.COMPLETED if ended else Status.FAILED,
            usage=stream.usage() if ended else stream.usage_so_far(),
            first_token_at=stream.first_at,
            finish_reason=stream.finish_reason,
            service_tier=stream.service_tier,
            error=error,
        )

    def ending(self, record: Record, *, with_usage: bool) -> bytes:
        """The billed usage chunk (when asked for) and ``[DONE]``."""
        return replies.stream_ending(self.usage_chunk, record, with_usage=with_usage)

    def error_event(self, error: KvgateError) -> bytes:
        """The event that ends the stream when it breaks after its first byte."""
        return replies.stream_error(error)

    async def close(self) -> None:
        """Closing litellm's stream closes the provider connection."""
        await self.stream.close()


async def build_hosted(
    settings: Settings, deployments: Mapping[str, Any], session: aiohttp.ClientSession
) -> HostedBackend | None:
    """The hosted backend; None if no model uses it. litellm is imported at startup only when
    a target's chat needs translating (every other call goes over the provider's own wire),
    else at the first Messages request that does."""
    chosen = {n: d for n, d in deployments.items() if isinstance(d, ProviderDeployment)}
    if not chosen:
        return None
    providers = Providers()
    translated = [n for n, d in chosen.items() if not all(speaks_chat(t) for t in d.targets)]
    if translated:
        await asyncio.to_thread(providers.load)
        log.info("litellm %s loaded for %d model(s)", providers.version, len(translated))
    return HostedBackend(
        providers=providers, deployments=chosen, keys=settings.provider_keys(), session=session
    )
