"""The vLLM backend: a pool of replicas behind each deployment, chosen by the routing fleet.

plan     the upstream body once (served model name, the tenant's cache salt, usage always
         asked for) and the request's route (its salted block hashes)
start    fleet.place: a replica for the attempt (up to two, on connect errors)
send     one aiohttp POST; open: the same, streamed, events split and inspected
learn    the reported cached tokens correct the routing index; the prompt's prefix break
         against its interaction's previous request is measured (serving/breaks.py)

Cached tokens by cache tier are taken from ``usage.prompt_tokens_details
.cached_tokens_by_source`` (vLLM's cache hit sources: device, host, disk) where a replica
reports them (``kvgate sim`` with lower tiers does; vLLM 0.32 counts tiers in its metrics
only) and recorded with the attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp

from gateway.accounting.records import Record, Status
from gateway.auth import cache_salt
from gateway.config import Deployment
from gateway.errors import (
    KvgateError,
    ResponseUnavailable,
    UpstreamError,
    UpstreamRejected,
    UpstreamUnavailable,
)
from gateway.routing.fleet import Fleet
from gateway.routing.placement import NoReplicaAvailable, Placement, Route
from gateway.serving import homes, replies
from gateway.serving.backend import Answer, NoUpstream
from gateway.serving.breaks import DEFAULT_SIZE, Arrival, BreakWatch, interaction_key, renderer
from gateway.serving.calls import Endpoint, forwardable
from gateway.serving.context import Attempt, Context, Expectation, Outcome, now
from gateway.serving.prompts import routing_prompt
from gateway.serving.wires import WIRES, Wire, WireStream
from gateway.upstream import sse
from gateway.upstream.vllm import UpstreamConnectError, UpstreamStream, json_object, post_json
from gateway.usage import Usage, UsageSource, from_openai

MAX_ATTEMPTS = 2
# The streams whose usage comes only when asked for (the Responses and Messages streams
# always end with theirs).
ASK_FOR_USAGE = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS})
# What a replica only reads (no tokens generated): routing is not taught by its answer,
# and it has no place in an interaction's prompts.
NOT_GENERATED = frozenset({Endpoint.EMBEDDINGS, Endpoint.COUNT_TOKENS})


@dataclass(frozen=True, slots=True)
class Plan:
    """What every attempt of one request shares."""

    fleet: Fleet
    body: bytes
    route: Route
    timeout: aiohttp.ClientTimeout
    tried: set[str]
    arrival: Arrival | None = None  # its place in its interaction, for prefix breakers
    wire: Wire | None = None  # an endpoint other than chat's and completions'
    generated: bool = True  # tokens are generated (its answer teaches routing)
    # A follow-up of a stored response: (the replica's own id, the one passed on, marked
    # with the replica that alone may serve it: serving/homes.py).
    previous: tuple[str, str] | None = None


class VllmBackend:
    """Serves every vLLM deployment; built once by the app's lifespan."""

    def __init__(
        self,
        *,
        secret: str,
        session: aiohttp.ClientSession,
        fleets: Mapping[str, Fleet],
        deployments: Mapping[str, Deployment],
        break_lru_size: int = DEFAULT_SIZE,
    ) -> None:
        self.secret = secret
        self.session = session
        self.fleets = dict(fleets)
        self._timeouts = {
            name: aiohttp.ClientTimeout(
                total=deployments[name].timeout_s, sock_connect=deployments[name].connect_timeout_s
            )
            for name in self.fleets
        }
        self.breaks = {
            name: BreakWatch(name, size=break_lru_size, render=renderer(fleet.hasher.tokenizer))
            for name, fleet in self.fleets.items()
        }

    async def plan(self, ctx: Context) -> Plan:
        """The upstream body and the route, computed once for every attempt."""
        call, fleet = ctx.call, self.fleets[ctx.deployment.name]
        salt = cache_salt(self.secret, ctx.principal.cache_scope, call.client_salt)
        body = dict(call.body)
        body["model"] = fleet.config.served_name
        body["cache_salt"] = salt
        if call.stream and call.endpoint in ASK_FOR_USAGE:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        tried, previous = (
            _pinned(fleet, body) if call.endpoint is Endpoint.RESPONSES else (set(), None)
        )
        encoded = forwardable(body)
        source = routing_prompt(call)
        route = await fleet.route_async(
            source,
            cache_salt=salt,
            request_id=ctx.request_id,
            interaction_id=ctx.interaction_id,
        )
        arrival = None
        generated = call.endpoint not in NOT_GENERATED
        # An interaction of its own has no predecessor.
        if generated and ctx.interaction_id != ctx.request_id:
            arrival = self.breaks[ctx.deployment.name].arrive(
                interaction_key(ctx.principal.tenant_id, ctx.interaction_id),
                route.prompt,
                source if ctx.principal.break_context else None,
            )
        # Every attempt sends ``encoded``: the parsed body, as large as the request, goes now
        # instead of being held beside it until the upstream answers.
        call.body.clear()
        timeout = self._timeouts[ctx.deployment.name]
        wire = WIRES.get(call.endpoint)
        return Plan(fleet, encoded, route, timeout, tried, arrival, wire, generated, previous)

    def start(self, ctx: Context, plan: Plan, number: int) -> Attempt:
        """A replica for attempt ``number``, never one this request already tried."""
        attempt = Attempt(
            request_id=ctx.attempt_id(number),
            number=number,
            upstream="",
            bills_as=ctx.deployment.bills_as,
            policy=plan.fleet.config.policy,
        )
        try:
            placement = plan.fleet.place(plan.route, exclude=frozenset(plan.tried))
        except NoReplicaAvailable as exc:
            raise NoUpstream(UpstreamUnavailable(str(exc)), attempt) from exc
        plan.tried.add(placement.replica.url)
        attempt.upstream, attempt.hold = placement.replica.url, Hold(plan.fleet, placement)
        return attempt

    async def send(self, ctx: Context, plan: Plan, attempt: Attempt) -> Answer:
        """One POST; the replica's answer, or its error in the gateway's shape."""
        url = attempt.upstream + ctx.call.endpoint.value
        try:
            reply = await post_json(self.session, url, plan.body, timeout=plan.timeout)
        except UpstreamConnectError as exc:
            plan.fleet.mark_down(_hold(attempt).placement.replica)
            if plan.previous is not None:
                raise _gone(plan.previous[1], attempt.upstream) from exc
            raise
        answer = _answer(reply.status, reply.body, plan.wire)
        if ctx.call.endpoint is Endpoint.RESPONSES:
            homes.renamed(answer.body, attempt.upstream, plan.previous)
        return answer

    async def open(self, ctx: Context, plan: Plan, attempt: Attempt) -> VllmStream | WireStream:
        """One streamed POST, open once the replica answered 200."""
        url = attempt.upstream + ctx.call.endpoint.value
        upstream = UpstreamStream(self.session, url, plan.body, plan.timeout)
        try:
            status = await upstream.open()
        except UpstreamConnectError as exc:
            plan.fleet.mark_down(_hold(attempt).placement.replica)
            if plan.previous is not None:
                raise _gone(plan.previous[1], attempt.upstream) from exc
            raise
        if status != 200:
            raw = await upstream.read_all()
            await upstream.close()
            _answer(status, raw, plan.wire)  # raises: a 200 would have been a stream
        if plan.wire is not None:
            replica = attempt.upstream
            return WireStream(
                upstream,
                plan.wire,
                prompt_chars=ctx.call.prompt_chars,
                rename=lambda response_id: homes.homed(response_id, replica),
                previous=plan.previous,
            )
        return VllmStream(upstream, prompt_chars=ctx.call.prompt_chars)

    def first_token(self, attempt: Attempt) -> None:
        """The replica started decoding: its queued prefill became a running sequence."""
        hold = _hold(attempt)
        hold.fleet.first_token(hold.placement)

    def learn(self, plan: Plan, attempt: Attempt, outcome: Outcome) -> Expectation:
        """Predicted and ceiling cached tokens; a completed answer corrects the index."""
        usage = outcome.usage
        if usage.source is not UsageSource.REPORTED or attempt.hold is None:
            return Expectation()
        fleet, placement, prompt_tokens = plan.fleet, _hold(attempt).placement, usage.prompt_tokens
        expectation = Expectation(
            predicted_cached_tokens=fleet.predicted_tokens(plan.route, placement, prompt_tokens),
            ceiling_cached_tokens=fleet.ceiling_tokens(plan.route, prompt_tokens),
            ceiling_exact=plan.route.prompt.exact,
            prefix_break=self.breaks[fleet.name].measure(plan.arrival, usage),
        )
        if outcome.status is Status.COMPLETED and plan.generated:
            fleet.learn(
                plan.route,
                placement,
                cached_tokens=usage.cache_read_tokens,
                prompt_tokens=prompt_tokens,
            )
        return expectation

    def release(self, attempt: Attempt) -> None:
        """The attempt no longer occupies its replica."""
        hold = _hold(attempt)
        hold.fleet.finish(hold.placement)

    def can_retry(self, plan: Plan, attempt: Attempt) -> bool:
        """One more replica, if one this request has not tried is up."""
        return attempt.number < MAX_ATTEMPTS and plan.fleet.has_alternative(plan.tried)

    def exhausted(self, error: KvgateError) -> KvgateError:
        """No replica could be reached: 503, so clients retry."""
        return UpstreamUnavailable(error.message)


@dataclass(frozen=True, slots=True)
class Hold:
    """An attempt's place on a replica of a fleet."""

    fleet: Fleet
    placement: Placement


def _hold(attempt: Attempt) -> Hold:
    hold = attempt.hold
    assert isinstance(hold, Hold)
    return hold


class VllmStream:
    """A replica's event stream, passed on as it arrives; usage and ``[DONE]`` held back."""

    def __init__(self, upstream: UpstreamStream, *, prompt_chars: int) -> None:
        self.upstream = upstream
        self.prompt_chars = prompt_chars
        self.state = sse.StreamState()
        self.first_token_at: datetime | None = None
        self.usage_chunk: dict[str, Any] | None = None

    async def events(self) -> AsyncIterator[bytes]:
        """The events of each read, together (one send per read, not per event)."""
        state, splitter = self.state, sse.EventSplitter()
        async for data in self.upstream.chunks():
            passing: list[bytes] = []
            for event in splitter.feed(data):
                if self.first_token_at is None:
                    self.first_token_at = now()
                    self._first(event)
                passed = self._inspect(event)
                if passed is not None:
                    passing.append(passed)
            if passing:
                yield b"".join(passing)
        if not state.saw_done:
            raise UpstreamError("upstream stream ended before [DONE]")

    def _first(self, event: bytes) -> None:
        """The stream's first event came (a provider's stream reads its tier there)."""

    def _inspect(self, event: bytes) -> bytes | None:
        """What of one event goes to the client: nothing of the usage chunk or ``[DONE]``."""
        held = sse.inspect(event, self.state)
        if held is not None:
            self.usage_chunk = held
            return None
        return None if self.state.saw_done else event

    def outcome(self, *, ended: bool, error: str | None) -> Outcome:
        """Reported usage when the usage chunk came; else an estimate, marked so."""
        state = self.state
        if state.usage is not None:
            usage = self._reported(state.usage)
        else:
            usage = Usage.estimated(self.prompt_chars, state.content_events)
        return Outcome(
            status=Status.COMPLETED if ended else Status.FAILED,
            usage=usage,
            first_token_at=self.first_token_at,
            finish_reason=state.finish_reason,
            error=error,
            cached_by_tier=_cached_by_tier(state.usage),
        )

    def _reported(self, usage: dict[str, Any]) -> Usage:
        """The usage chunk's usage, read in the upstream's convention (a replica's: OpenAI's)."""
        return from_openai(usage)

    def ending(self, record: Record, *, with_usage: bool) -> bytes:
        """The billed usage chunk (when asked for) and ``[DONE]``."""
        return replies.stream_ending(self.usage_chunk, record, with_usage=with_usage)

    def error_event(self, error: KvgateError) -> bytes:
        """The event that ends the stream when it breaks after its first byte."""
        return replies.stream_error(error)

    async def close(self) -> None:
        """Close the connection: cancels the replica's request if it is still running."""
        await self.upstream.close()


def _pinned(fleet: Fleet, body: dict[str, Any]) -> tuple[set[str], tuple[str, str] | None]:
    """A follow-up of a stored response: the replicas it must not go to (all but the one
    its id names) and the (replica's own, marked) id it continues; ``body`` is given the
    replica's own. Nothing of the kind for an id without a mark (routed as any request)."""
    previous = body.get("previous_response_id")
    own, key = homes.split_home(previous) if isinstance(previous, str) else (None, None)
    if own is None or key is None:
        return set(), None
    assert isinstance(previous, str)
    replicas = [r.url for r in fleet.replicas]
    home = homes.home_of(key, replicas)
    others = {url for url in replicas if url != home}
    if home is None or not fleet.has_alternative(others):
        raise _gone(previous, home)
    body["previous_response_id"] = own
    return others, (own, previous)


def _gone(response_id: str, replica: str | None) -> ResponseUnavailable:
    where = (
        f"replica {replica}, which is no longer available"
        if replica
        else ("a replica that is no longer in this deployment")
    )
    return ResponseUnavailable(
        f"response '{response_id}' was stored by {where}, and the conversation went with "
        "it: send the conversation again as input, without previous_response_id",
        param="previous_response_id",
    )


def _answer(status: int, raw: bytes, wire: Wire | None = None) -> Answer:
    """A replica's complete answer, or the error it amounts to."""
    data = json_object(raw)
    if status != 200 or data is None:
        raise _upstream_error(status, data, raw)
    if wire is not None:
        return Answer.of(data, wire)
    upstream_usage = data.get("usage")
    return Answer(
        body=data,
        upstream_usage=upstream_usage,
        outcome=Outcome(
            status=Status.COMPLETED,
            usage=from_openai(upstream_usage if isinstance(upstream_usage, dict) else None),
            finish_reason=_finish_reason(data.get("choices")),
            cached_by_tier=_cached_by_tier(upstream_usage),
        ),
    )


def _cached_by_tier(usage: Any) -> tuple[int, int] | None:
    """(host memory, disk) cached tokens, when the usage says them by source."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    sources = details.get("cached_tokens_by_source") if isinstance(details, dict) else None
    if not isinstance(sources, dict):
        return None
    host, disk = sources.get("host", 0), sources.get("disk", 0)
    if not (isinstance(host, int) and isinstance(disk, int)) or host < 0 or disk < 0:
        return None
    return host, disk


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


def _finish_reason(choices: Any) -> str | None:
    """The first choice's finish reason, if the upstream's answer has one where expected."""
    first = choices[0] if isinstance(choices, list) and choices else None
    reason = first.get("finish_reason") if isinstance(first, dict) else None
    return str(reason) if reason is not None else None
