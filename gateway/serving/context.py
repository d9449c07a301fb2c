"""The values every request path shares: a request, its attempts and how each ended.

Context   one client request (who, which deployment, the parsed call), for all attempts
Attempt   one try of it on one upstream (a replica, or a provider target)
Outcome   how an attempt ended: status, usage, first token, finish reason, tier, error,
          cached tokens by cache tier where the replica reports them
Expectation  what routing expected of the attempt (predicted and ceiling cached tokens,
             and its prefix break against the interaction's previous request)
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gateway.accounting.records import Status
from gateway.auth import Principal
from gateway.config import AnyDeployment
from gateway.routing.breaks import PrefixBreak
from gateway.serving.calls import Call
from gateway.usage import Usage


def new_request_id() -> str:
    """A fresh request id: the idempotency key of the request's first attempt."""
    return "req_" + secrets.token_hex(12)


def now() -> datetime:
    """The current time, aware UTC."""
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Context:
    """One client request as every attempt of it sees it."""

    request_id: str
    interaction_id: str
    principal: Principal
    deployment: AnyDeployment
    call: Call
    traceparent: str | None = None  # the caller's W3C trace context, for telemetry

    def attempt_id(self, number: int) -> str:
        """The first attempt keeps the request id; later ones are ``<id>.<n>``."""
        return self.request_id if number == 1 else f"{self.request_id}.{number}"


@dataclass(slots=True)
class Attempt:
    """One try of a request on one upstream; ``hold`` is the backend's own handle on it
    (a replica placement, a provider target)."""

    request_id: str
    number: int
    upstream: str
    bills_as: str
    policy: str
    hold: Any = None
    started_at: datetime = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended, as far as billing and routing care."""

    status: Status
    usage: Usage
    first_token_at: datetime | None = None
    finish_reason: str | None = None
    service_tier: str | None = None
    error: str | None = None
    # Cached tokens the replica served from host memory and from disk (the rest of
    # cache_read_tokens came from GPU memory); None where it does not say.
    cached_by_tier: tuple[int, int] | None = None

    @classmethod
    def failed(cls, error: str) -> Outcome:
        """An attempt that got no answer to bill."""
        return cls(status=Status.FAILED, usage=Usage.missing(), error=error)

    @classmethod
    def left(cls, prompt_chars: int) -> Outcome:
        """A client that went before any answer: its prompt estimated, as a stream cut before
        its first token is (the replica had it, and may have prefilled it)."""
        return cls(
            status=Status.CANCELLED,
            usage=Usage.estimated(prompt_chars, 0),
            error="client disconnected",
        )

    @classmethod
    def refused(cls, error: str) -> Outcome:
        """A request turned away at admission (budget, rate limit): nothing to bill."""
        return cls(status=Status.REFUSED, usage=Usage.missing(), error=error)


@dataclass(frozen=True, slots=True)
class Expectation:
    """What routing predicted for an attempt, and what a perfect cache would have served."""

    predicted_cached_tokens: int | None = None
    ceiling_cached_tokens: int | None = None
    # Whether both were counted in the replicas' own tokens (a tokenizer), or approximated.
    ceiling_exact: bool | None = None
    # Where the prompt left its interaction's previous one (gateway/serving/breaks.py).
    prefix_break: PrefixBreak | None = None


NO_EXPECTATION = Expectation()
