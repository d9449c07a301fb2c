"""Hosted providers on their own wire, without litellm: the same-wire half of the hosted
backend (gateway/serving/hosted.py), over the gateway's one aiohttp session.

    OpenAI     /v1/chat/completions, /v1/completions (and  ``Authorization: Bearer KEY``
               every provider that speaks OpenAI's wire:
               gateway/serving/chatwire.py),
               /v1/embeddings, /v1/responses
    Anthropic  /v1/messages, /v1/messages/count_tokens ``x-api-key: KEY``, the client's
                                                       ``anthropic-version`` (and betas)

The client's body goes as it came (``cache_control`` and every member the gateway does
not know untouched), with the target's model name put in and kvgate's own members
(``cache_salt``, ``metadata.interaction_id``) taken out. The answer, or the stream's
events as they arrive, is read and billed by the wire's code (gateway/serving/wires.py),
as on the vLLM path. A connection refused or broken, a timeout, a 429 or a 5xx fails over
to the deployment's next target that speaks the wire; another 4xx is the client's, said
with the provider's status and message.

Base URLs follow litellm's ``api_base``: OpenAI's includes ``/v1``, Anthropic's does not.
Every provider host has its own pool of kept-alive connections inside the gateway's one
session (aiohttp pools per host, port and TLS); answers are asked for uncompressed, as the
session passes bytes through without decompressing them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from gateway.config import ProviderTarget
from gateway.errors import UpstreamError
from gateway.serving.backend import Answer
from gateway.serving.calls import Call, Endpoint, forwardable
from gateway.serving.chatwire import (
    OPENAI_WIRE,
    ProviderChatStream,
    chat_answer,
    chat_body,
    chat_url,
)
from gateway.serving.wires import PROVIDER_WIRES, WireStream
from gateway.upstream.providers import ProviderFailure
from gateway.upstream.vllm import UpstreamStream, json_object, post_json

DEFAULT_BASES = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
PATHS = {
    Endpoint.EMBEDDINGS: "/embeddings",
    Endpoint.RESPONSES: "/responses",
    Endpoint.MESSAGES: "/v1/messages",
    Endpoint.COUNT_TOKENS: "/v1/messages/count_tokens",
}
ANTHROPIC_VERSION = "2023-06-01"  # when the client named none (Anthropic's SDKs always do)
# A request as a target is sent it: URL, body, headers.
Prepared = tuple[str, bytes, dict[str, str]]


def provider_body(body: Mapping[str, Any], model: str) -> bytes:
    """The client's body for the provider: its model name in, kvgate's own members out."""
    sent = {k: v for k, v in body.items() if k != "cache_salt"}
    sent["model"] = model
    metadata = sent.get("metadata")
    if isinstance(metadata, dict) and "interaction_id" in metadata:
        rest = {k: v for k, v in metadata.items() if k != "interaction_id"}
        if rest:
            sent["metadata"] = rest
        else:
            del sent["metadata"]
    return forwardable(sent)


def provider_headers(target: ProviderTarget, call: Call, key: str | None) -> dict[str, str]:
    """The provider's key in its own header, and the client's wire headers."""
    headers = dict(call.wire_headers)
    headers["accept-encoding"] = "identity"
    if target.provider == "anthropic":
        headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
        if key:
            headers["x-api-key"] = key
    elif key:
        headers["authorization"] = f"Bearer {key}"
    return headers


def provider_url(target: ProviderTarget, endpoint: Endpoint) -> str:
    """Where the target serves ``endpoint``."""
    base = target.base_url or DEFAULT_BASES[target.provider]
    return base + PATHS[endpoint]


def rejection(status: int, raw: bytes, model: str) -> ProviderFailure:
    """A provider's error answer: retryable when another target may well succeed."""
    data = json_object(raw)
    error = data.get("error") if data is not None else None
    message = error.get("message") if isinstance(error, dict) else None
    said = " ".join(str(message).split()) if message else raw[:200].decode(errors="replace")
    return ProviderFailure(
        f"{model}: provider answered {status}: {said[:300]}",
        status=status,
        retryable=status == 429 or status >= 500,
    )


def _unreachable(exc: UpstreamError, model: str) -> ProviderFailure:
    """No answer at all (refused, broken, timed out): another target may answer."""
    return ProviderFailure(f"{model}: {exc.message}", status=None, retryable=True)


class Passthrough:
    """Calls hosted targets on their own wire; one for the hosted backend."""

    def __init__(self, session: aiohttp.ClientSession, keys: Mapping[str, str]) -> None:
        self.session = session
        self.keys = dict(keys)

    def request(self, call: Call, target: ProviderTarget) -> Prepared:
        """The call as ``target`` is sent it: URL, body, headers."""
        key = self.keys.get(target.api_key_env) if target.api_key_env else None
        headers = provider_headers(target, call, key)
        if call.endpoint in OPENAI_WIRE:
            body = chat_body(call.body, target, call.endpoint, stream=call.stream)
            return chat_url(target, call.endpoint), forwardable(body), headers
        return (
            provider_url(target, call.endpoint),
            provider_body(call.body, target.provider_model),
            headers,
        )

    async def send(
        self, call: Call, target: ProviderTarget, prepared: Prepared | None = None
    ) -> Answer:
        """One call (``prepared`` already, or now), answered whole; the answer read by the
        endpoint's wire."""
        url, body, headers = prepared or self.request(call, target)
        timeout = aiohttp.ClientTimeout(total=target.timeout_s)
        try:
            reply = await post_json(self.session, url, body, timeout=timeout, headers=headers)
        except UpstreamError as exc:
            raise _unreachable(exc, target.litellm_model) from exc
        data = json_object(reply.body)
        if reply.status != 200 or data is None:
            raise rejection(reply.status, reply.body, target.litellm_model)
        if call.endpoint in OPENAI_WIRE:
            return chat_answer(data, target)
        return Answer.of(data, PROVIDER_WIRES[call.endpoint])

    async def open(
        self, call: Call, target: ProviderTarget, prepared: Prepared | None = None
    ) -> WireStream | ProviderChatStream:
        """One streamed call (``prepared`` already, or now), open once the provider
        answered 200."""
        url, body, headers = prepared or self.request(call, target)
        timeout = aiohttp.ClientTimeout(total=target.timeout_s)
        upstream = UpstreamStream(self.session, url, body, timeout, headers)
        try:
            status = await upstream.open()
        except UpstreamError as exc:
            raise _unreachable(exc, target.litellm_model) from exc
        if status != 200:
            raw = await upstream.read_all()
            await upstream.close()
            raise rejection(status, raw, target.litellm_model)
        if call.endpoint in OPENAI_WIRE:
            return ProviderChatStream(upstream, target, prompt_chars=call.prompt_chars)
        return WireStream(upstream, PROVIDER_WIRES[call.endpoint], prompt_chars=call.prompt_chars)
