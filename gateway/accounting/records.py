"""Record: everything kvgate knows about one attempt of one request, and its journal form."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

import orjson

from gateway.usage import Usage, UsageSource
from pricing.cost import Cost


class Status(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REFUSED = "refused"  # turned away at admission (a budget or rate limit): no cost


@dataclass(frozen=True, slots=True)
class Record:
    """One attempt; ``request_id`` is the idempotency key of its database row."""

    request_id: str
    tenant_id: str
    api_key_id: str
    interaction_id: str
    model: str
    deployment: str
    upstream: str
    started_at: datetime
    ended_at: datetime
    status: Status
    usage: Usage
    cost: Cost
    attempt: int = 1
    policy: str = ""
    first_token_at: datetime | None = None
    finish_reason: str | None = None
    price_id: str | None = None
    # Which of the price entry's rate sets the cost used (Price.rate_class).
    rate_class: str | None = None
    predicted_cached_tokens: int | None = None
    ceiling_cached_tokens: int | None = None
    # Whether the router counted prediction and ceiling in the replica's own tokens (its
    # tokenizer) or estimated them from character blocks (text mode); None without them.
    ceiling_exact: bool | None = None
    # Of cache_read_tokens, those served from host memory and from disk (the rest from GPU
    # memory), where the replica reports them; None where it does not.
    cache_read_host_tokens: int | None = None
    cache_read_disk_tokens: int | None = None
    stream: bool = False
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Prefix breakers (gateway/serving/breaks.py): where the prompt's block chain first left
    # the interaction's previous request's, the tokens of it that could not be reused, and
    # whether that was early; the text around it (JSON) for tenants that opted in.
    break_tokens: int | None = None
    lost_tokens: int | None = None
    break_early: bool | None = None
    break_context: str | None = None
    # Cost attribution: the request's end user and tags (tenant data, like the rest).
    end_user: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    # The inference endpoint the call came in on (its path: /v1/embeddings, /v1/responses…).
    endpoint: str = "/v1/chat/completions"
    # What the attempt's OpenTelemetry span needs beyond the rest (the writer makes it, see
    # accounting/spans.py): the GenAI operation name (chat, text_completion, embeddings),
    # the provider (vllm, or litellm's), the model that answered (as billed), and the
    # caller's W3C traceparent. Journaled like the rest; never stored in the database.
    # Lines journaled before them read as None, and make no span.
    operation: str | None = None
    provider: str | None = None
    response_model: str | None = None
    traceparent: str | None = None

    @property
    def priced(self) -> bool:
        """Whether a price entry priced this attempt."""
        return self.price_id is not None

    @property
    def stored_ceiling(self) -> int | None:
        """The hit-rate ceiling a record's row keeps: the router's, raised to what was achieved.

        The ceiling is the prompt tokens whose blocks had been seen before in the request's cache
        scope. The router counts it from the blocks it saw, and that count can fall short of the
        truth: in text mode (no tokenizer) its blocks are character chunks, scaled to tokens;
        replicas also cache the blocks of generated output, which come back as the next turn's
        prompt but were never in a prompt the router hashed; and the router does not see what other
        gateways sent or what replicas kept across its restart. A replica's reported hit is proof
        that those blocks had been computed before, so the ceiling is at least the cached tokens the
        replica reported, in the replica's own tokens: the very figures the achieved hit rate uses.

        So every row holds cache_read_tokens <= ceiling_cached_tokens, and every efficiency summed
        over the same rows (a request, an hour, a tenant, a replica, a period) is at most 100 % by
        construction; nothing is clamped where it is shown. Converting the reported count into the
        router's units instead would compare two estimates and still miss blocks the router never
        saw.
        """
        ceiling = self.ceiling_cached_tokens
        return None if ceiling is None else max(ceiling, self.usage.cache_read_tokens)

    def to_json(self) -> bytes:
        """One journal line (no trailing newline)."""
        # orjson writes dataclasses, datetimes and enums natively (and fast); Decimals
        # go through _encode as exact strings.
        return orjson.dumps(self, default=_encode)

    @classmethod
    def from_json(cls, line: bytes) -> Record:
        """The record a journal line holds: the inverse of ``to_json``."""
        data = orjson.loads(line)
        data["started_at"] = datetime.fromisoformat(data["started_at"])
        data["ended_at"] = datetime.fromisoformat(data["ended_at"])
        if data["first_token_at"] is not None:
            data["first_token_at"] = datetime.fromisoformat(data["first_token_at"])
        data["status"] = Status(data["status"])
        usage = data["usage"]
        usage["source"] = UsageSource(usage["source"])
        data["usage"] = Usage(**usage)
        data["cost"] = Cost(**{k: Decimal(v) for k, v in data["cost"].items()})
        return cls(**data)


def _encode(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"cannot journal {type(value).__name__}")
