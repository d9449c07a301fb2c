"""What every request path shares: the request's context, its id, and the clock."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.api.calls import Call
from gateway.auth import Principal
from gateway.config import Deployment


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
    deployment: Deployment
    call: Call
