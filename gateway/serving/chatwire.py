"""Chat and completions on a hosted provider's own OpenAI wire: the same aiohttp path as
vLLM's, no litellm.

A target whose provider speaks OpenAI's wire (gateway/serving/bases.py: litellm's prefixes,
or ``openai/`` with an ``api_base`` of any OpenAI-compatible server) is sent:

    body     the client's members in CHAT_PARAMETERS (gateway/upstream/providers.py:
             nothing else leaves the gateway, as on the litellm path) or, for
             ``/v1/completions``, COMPLETION_PARAMETERS (OpenAI's reference); the
             provider's model name, ``stream`` and, on streams,
             ``stream_options.include_usage`` forced on; Anthropic-family models behind
             OpenRouter get the stable-prefix marks on chat
    url      ``api_base`` (else litellm's default base for the provider) +
             /chat/completions or /completions
    key      ``Authorization: Bearer`` the key named by ``api_key_env``

The answer's usage is read in the provider's convention (``gateway.usage.openai_wire``:
DeepSeek's hit/miss counts, OpenRouter's writes inside the prompt), its service tier billed.
Anthropic, Gemini, Bedrock, Vertex and every other prefix stay on litellm for chat, which
translates; they serve no ``/v1/completions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from gateway.accounting.records import Status
from gateway.config import ProviderTarget, anthropic_family
from gateway.serving.backend import Answer
from gateway.serving.bases import openai_base
from gateway.serving.calls import Endpoint
from gateway.serving.context import Outcome
from gateway.serving.vllm import VllmStream
from gateway.upstream import sse
from gateway.upstream.providers import CHAT_PARAMETERS, mark_stable_prefix, service_tier
from gateway.usage import Usage, openai_wire

OPENAI_PATHS = {Endpoint.CHAT: "/chat/completions", Endpoint.COMPLETIONS: "/completions"}
OPENAI_WIRE = frozenset(OPENAI_PATHS)  # the endpoints served here
# OpenAI's legacy completions parameters (its API reference): nothing else leaves the gateway.
COMPLETION_PARAMETERS = frozenset(
    {
        "prompt",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "suffix",
        "temperature",
        "top_p",
        "user",
    }
)


def chat_url(target: ProviderTarget, endpoint: Endpoint = Endpoint.CHAT) -> str:
    """The target's ``/chat/completions`` (or ``/completions``)."""
    base = openai_base(target)
    assert base is not None  # served here only where the provider speaks the wire
    return base + OPENAI_PATHS[endpoint]


def chat_body(
    body: Mapping[str, Any],
    target: ProviderTarget,
    endpoint: Endpoint = Endpoint.CHAT,
    *,
    stream: bool,
) -> dict[str, Any]:
    """The provider's body: the allowed parameters, its model name, usage asked for."""
    if endpoint is Endpoint.CHAT:
        sent = {k: v for k, v in body.items() if k in CHAT_PARAMETERS}
        if target.cache_control and anthropic_family(target.litellm_model):
            mark_stable_prefix(sent, target.cache_ttl)
    else:
        sent = {k: v for k, v in body.items() if k in COMPLETION_PARAMETERS}
    sent["model"] = target.provider_model
    if stream:
        sent["stream"] = True
        sent["stream_options"] = {"include_usage": True}
    return sent


def _finish(data: Mapping[str, Any]) -> str | None:
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    reason = first.get("finish_reason") if isinstance(first, dict) else None
    return str(reason) if reason else None


def chat_answer(data: dict[str, Any], target: ProviderTarget) -> Answer:
    """A complete chat (or completions) answer, its usage in the provider's convention."""
    upstream_usage = data.pop("usage", None)
    raw = upstream_usage if isinstance(upstream_usage, dict) else None
    return Answer(
        body=data,
        upstream_usage=raw,
        outcome=Outcome(
            status=Status.COMPLETED,
            usage=openai_wire(target.provider)(raw),
            finish_reason=_finish(data),
            service_tier=service_tier({"service_tier": data.get("service_tier"), "usage": raw}),
        ),
    )


class ProviderChatStream(VllmStream):
    """A provider's chat (or completions) stream as vLLM's is passed on (usage chunk and
    ``[DONE]`` held), read in the provider's convention; usage riding on a content chunk
    (DeepSeek's last) is taken off it and held back as its own chunk, so the client sees
    only the billed one."""

    def __init__(self, upstream: Any, target: ProviderTarget, *, prompt_chars: int) -> None:
        super().__init__(upstream, prompt_chars=prompt_chars)
        self.target = target
        self.service_tier: str | None = None

    def _first(self, event: bytes) -> None:
        self.service_tier = _tier(event)

    def _inspect(self, event: bytes) -> bytes | None:
        """As a replica's, but a finish chunk counts no token, and usage riding on content
        is taken off it."""
        state = self.state
        before, counted = state.usage, state.content_events
        held = sse.inspect(event, state)
        if state.content_events > counted and _empty_delta(event):
            state.content_events = counted  # a finish chunk: no token, as litellm counts
        if held is not None:
            self.usage_chunk = held
            self.service_tier = service_tier(held) or self.service_tier
            return None
        if state.usage is not before:
            return self._strip_usage(event)
        return None if state.saw_done else event

    def _strip_usage(self, event: bytes) -> bytes:
        """A content chunk that carried the usage, without it (kept as the usage chunk)."""
        chunk = orjson.loads(sse.payload(event) or b"{}")
        usage = chunk.pop("usage")
        self.usage_chunk = {**{k: v for k, v in chunk.items() if k != "choices"}, "usage": usage}
        self.usage_chunk["choices"] = []
        return sse.encode(chunk)

    def _reported(self, usage: dict[str, Any]) -> Usage:
        return openai_wire(self.target.provider)(usage)

    def outcome(self, *, ended: bool, error: str | None) -> Outcome:
        """As a replica's, with the tier the provider named; cached tokens by tier are only
        a replica's to say."""
        outcome = super().outcome(ended=ended, error=error)
        return replace(outcome, service_tier=self.service_tier, cached_by_tier=None)


def _tier(event: bytes) -> str | None:
    """The service tier a chunk says (OpenAI repeats it in every chunk)."""
    if b'"service_tier"' not in event:
        return None
    try:
        chunk = orjson.loads(sse.payload(event) or b"")
    except orjson.JSONDecodeError:
        return None
    return service_tier(chunk) if isinstance(chunk, dict) else None


_EMPTY = (b'"delta":{}', b'"delta": {}', b'"text":""', b'"text": ""')


def _empty_delta(event: bytes) -> bool:
    """A chunk whose delta (or completion text) carries nothing generated: the one that
    only says why it ended."""
    return any(empty in event for empty in _EMPTY)
