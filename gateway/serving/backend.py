"""What a backend kind (vLLM pools, hosted providers) provides to the one request path.

    plan(ctx)                    everything computed once for all attempts (body, route,
                                 targets)
    start(ctx, plan, number)     attempt ``number``, or NoUpstream when none can take it
    send / open                  one call: a whole Answer, or an UpstreamEvents stream
    learn(plan, attempt, outcome)  what the reply teaches routing; the attempt's Expectation
    release(attempt)             the attempt is over (its replica slot is free)
    can_retry(plan, attempt)     whether a retryable failure of ``attempt`` is worth another
    exhausted(error)             the error clients get when the last retryable attempt failed

A backend raises ``KvgateError``s; one with ``retryable`` set failed before any byte of an
answer, so the path may try another attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from starlette.responses import Response

from gateway.accounting.records import Record
from gateway.errors import KvgateError
from gateway.serving import replies
from gateway.serving.context import Attempt, Context, Expectation, Outcome
from gateway.serving.wires import Wire


class NoUpstream(Exception):
    """No upstream can take an attempt (all replicas down): ``attempt`` is recorded as
    failed, unplaced, and ``error`` is what the client gets."""

    def __init__(self, error: KvgateError, attempt: Attempt) -> None:
        super().__init__(error.message)
        self.error = error
        self.attempt = attempt


@dataclass(slots=True)
class Answer:
    """A complete (non-streamed) answer: the body to return, its usage as the upstream
    reported it, and the attempt's outcome; ``wire`` bills an endpoint other than chat's
    and completions' (gateway/serving/wires.py)."""

    body: dict[str, Any]
    upstream_usage: Any
    outcome: Outcome
    wire: Wire | None = None

    @classmethod
    def of(cls, body: dict[str, Any], wire: Wire) -> Answer:
        """A complete answer on ``wire``, its outcome read from the body."""
        return cls(
            body=body, upstream_usage=body.get("usage"), outcome=wire.outcome(body), wire=wire
        )

    def reply(self, record: Record | None) -> Response:
        """The answer to send, its usage billed from ``record`` (None: not billed)."""
        if self.wire is not None:
            return self.wire.reply(self.body, record)
        assert record is not None
        return replies.json_reply(self.body, self.upstream_usage, record)


class UpstreamEvents(Protocol):
    """An open stream: events to pass through, and what they said about billing."""

    @property
    def first_token_at(self) -> datetime | None:
        """When the first event arrived (None before it)."""
        ...

    @property
    def usage_chunk(self) -> dict[str, Any] | None:
        """The usage-only chunk held back, if the upstream sent one."""
        ...

    def events(self) -> AsyncIterator[bytes]:
        """The bytes to send on, as they arrive (usage chunk and ``[DONE]`` held back)."""
        ...

    def outcome(self, *, ended: bool, error: str | None) -> Outcome:
        """The attempt's outcome: completed when ``ended`` cleanly, else failed or
        cancelled (``error`` says which), with reported or estimated usage."""
        ...

    def ending(self, record: Record, *, with_usage: bool) -> bytes:
        """The stream's last events, billed: sent once its record is durable."""
        ...

    def error_event(self, error: KvgateError) -> bytes:
        """The event that ends the stream when it broke after its first byte."""
        ...

    async def close(self) -> None:
        """Stop reading; closes the upstream call."""
        ...


class Backend(Protocol):
    """One backend kind, serving every deployment of that kind."""

    async def plan(self, ctx: Context) -> Any:
        """Work done once per request, for all its attempts."""
        ...

    def start(self, ctx: Context, plan: Any, number: int) -> Attempt:
        """Attempt ``number`` of the request; raises NoUpstream when none is left."""
        ...

    async def send(self, ctx: Context, plan: Any, attempt: Attempt) -> Answer:
        """One non-streamed call."""
        ...

    async def open(self, ctx: Context, plan: Any, attempt: Attempt) -> UpstreamEvents:
        """One streamed call, open once the upstream answered 200."""
        ...

    def first_token(self, attempt: Attempt) -> None:
        """The attempt's first event reached the client."""
        ...

    def learn(self, plan: Any, attempt: Attempt, outcome: Outcome) -> Expectation:
        """Fold the outcome into routing; what routing expected of the attempt."""
        ...

    def release(self, attempt: Attempt) -> None:
        """The attempt is over."""
        ...

    def can_retry(self, plan: Any, attempt: Attempt) -> bool:
        """Whether another attempt may follow a retryable failure of ``attempt``."""
        ...

    def exhausted(self, error: KvgateError) -> KvgateError:
        """What to answer when ``error`` (retryable) ended the last possible attempt."""
        ...
