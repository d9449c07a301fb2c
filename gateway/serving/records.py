"""The one mapping from (context, attempt, outcome, expectation) to a priced Record."""

from __future__ import annotations

from gateway.accounting.ledger import Ledger
from gateway.accounting.records import Record
from gateway.serving.calls import Endpoint
from gateway.serving.context import NO_EXPECTATION, Attempt, Context, Expectation, Outcome, now

# The OpenTelemetry GenAI conventions' operation names: the Responses and Messages APIs are
# chats. Kept on the record, for the span its writer makes (accounting/spans.py).
OPERATIONS = {
    Endpoint.CHAT: "chat",
    Endpoint.COMPLETIONS: "text_completion",
    Endpoint.EMBEDDINGS: "embeddings",
    Endpoint.RESPONSES: "chat",
    Endpoint.MESSAGES: "chat",
    Endpoint.COUNT_TOKENS: "chat",
}


def provider_of(ctx: Context, upstream: str) -> str:
    """``vllm`` for a replica; a litellm model's provider prefix (no prefix: openai)."""
    if ctx.deployment.backend == "vllm":
        return "vllm"
    provider, slash, _ = upstream.partition("/")
    return provider if slash else "openai"


def record_of(
    ledger: Ledger,
    ctx: Context,
    attempt: Attempt,
    outcome: Outcome,
    expectation: Expectation = NO_EXPECTATION,
) -> Record:
    """The attempt's record, priced with the entry in force at the attempt's start."""
    usage, tiers, broken = outcome.usage, outcome.cached_by_tier, expectation.prefix_break
    priced = ledger.price(
        attempt.bills_as, at=attempt.started_at, usage=usage, tier=outcome.service_tier
    )
    return Record(
        request_id=attempt.request_id,
        tenant_id=ctx.principal.tenant_id,
        api_key_id=ctx.principal.api_key_id,
        interaction_id=ctx.interaction_id,
        attempt=attempt.number,
        model=ctx.call.model,
        endpoint=ctx.call.endpoint.value,
        deployment=ctx.deployment.name,
        upstream=attempt.upstream,
        policy=attempt.policy,
        started_at=attempt.started_at,
        first_token_at=outcome.first_token_at,
        ended_at=now(),
        status=outcome.status,
        finish_reason=outcome.finish_reason,
        usage=usage,
        price_id=priced.price_id,
        rate_class=priced.rate_class,
        cost=priced.cost,
        stream=ctx.call.stream,
        error=outcome.error,
        predicted_cached_tokens=expectation.predicted_cached_tokens,
        ceiling_cached_tokens=expectation.ceiling_cached_tokens,
        ceiling_exact=expectation.ceiling_exact,
        cache_read_host_tokens=tiers[0] if tiers is not None else None,
        cache_read_disk_tokens=tiers[1] if tiers is not None else None,
        extra={"service_tier": outcome.service_tier} if outcome.service_tier else {},
        break_tokens=broken.break_tokens if broken else None,
        lost_tokens=broken.lost_tokens if broken else None,
        break_early=broken.early if broken else None,
        break_context=broken.context if broken else None,
        end_user=ctx.call.end_user,
        tags=dict(ctx.call.tags),
        operation=OPERATIONS[ctx.call.endpoint],
        provider=provider_of(ctx, attempt.upstream),
        response_model=attempt.bills_as,
        traceparent=ctx.traceparent,
    )
