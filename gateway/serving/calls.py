"""A call as the request path takes it: which endpoint, the model, the client's body and
the few facts serving acts on; parsed and validated at the edge (gateway/api/calls.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from gateway.config import Deployment, ProviderDeployment, ProviderTarget
from gateway.errors import InvalidRequest
from gateway.routing.token_ids import TokenIds
from gateway.serving.bases import speaks_completions

MAX_NESTING = 254  # levels of JSON nesting orjson writes (it reads 1024)


class Endpoint(StrEnum):
    """The inference endpoints, by path."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    EMBEDDINGS = "/v1/embeddings"
    RESPONSES = "/v1/responses"
    MESSAGES = "/v1/messages"
    COUNT_TOKENS = "/v1/messages/count_tokens"

    @property
    def anthropic(self) -> bool:
        """Anthropic's wire: its headers, its error shape."""
        return self in (Endpoint.MESSAGES, Endpoint.COUNT_TOKENS)

    @property
    def billed(self) -> bool:
        """Whether a call is priced and recorded (counting tokens generates nothing)."""
        return self is not Endpoint.COUNT_TOKENS


# The endpoints a vLLM deployment serves: every wire, vLLM serves them all itself.
VLLM_SERVED: tuple[Endpoint, ...] = tuple(Endpoint)
# What a hosted target serves beyond chat, Messages and Responses (which litellm translates
# for every provider): the endpoints its provider speaks on its own wire, forwarded
# untranslated (gateway/serving/passthrough.py), and /v1/completions where the provider
# serves it (gateway/serving/bases.py). Counting Messages tokens is served only where the
# provider counts them itself: litellm's counter is an approximation for the others.
PROVIDER_WIRES: dict[str, tuple[Endpoint, ...]] = {
    "openai": (Endpoint.EMBEDDINGS, Endpoint.RESPONSES),
    "anthropic": (Endpoint.MESSAGES, Endpoint.COUNT_TOKENS),
}
TRANSLATED: tuple[Endpoint, ...] = (Endpoint.CHAT, Endpoint.MESSAGES, Endpoint.RESPONSES)


def speaks(target: ProviderTarget) -> tuple[Endpoint, ...]:
    """The endpoints one hosted target serves: chat, Messages, Responses, its provider's own."""
    own = PROVIDER_WIRES.get(target.provider, ())
    if speaks_completions(target):
        own = (Endpoint.COMPLETIONS, *own)
    return (*TRANSLATED, *(e for e in own if e not in TRANSLATED))


def translates(target: ProviderTarget, endpoint: Endpoint) -> bool:
    """Whether ``endpoint`` reaches ``target`` as chat, translated (Messages or Responses of
    a provider that does not speak that wire itself: gateway/serving/translated.py)."""
    own = PROVIDER_WIRES.get(target.provider, ())
    return endpoint in (Endpoint.MESSAGES, Endpoint.RESPONSES) and endpoint not in own


def served(deployment: Deployment | ProviderDeployment) -> tuple[Endpoint, ...]:
    """The endpoints a deployment serves (/v1/models lists them): a hosted one's are those
    any of its targets speaks, each served by those targets in their order."""
    if not isinstance(deployment, ProviderDeployment):
        return VLLM_SERVED
    spoken = {e for target in deployment.targets for e in speaks(target)}
    return tuple(e for e in Endpoint if e in spoken)


@dataclass(frozen=True, slots=True)
class Call:
    """One inference request as the gateway understands it.

    ``body`` is the client's JSON object. The vLLM path empties it once it has encoded its
    upstream body and routed the prompt, a hosted one once every target's request on its
    own wire is built (a large body is then not held twice).
    """

    endpoint: Endpoint
    model: str
    body: dict[str, Any]
    stream: bool
    client_wants_usage: bool
    client_salt: str | None
    interaction_hint: str | None
    prompt_chars: int
    # Cost attribution (gateway/api/attribution.py): the end user (OpenAI's ``user``) and
    # the tags (X-Kvgate-Tags or ``metadata``), as (key, value) pairs sorted by key.
    end_user: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    # The body's size in bytes as received: a bound on its prompt's tokens (a byte-level
    # tokenizer makes at most one token per byte; the JSON around the text covers a chat
    # template's own tokens). 0 where unknown.
    body_bytes: int = 0
    # The client's headers of its wire that a same-wire provider is sent as they came
    # (Anthropic's ``anthropic-version`` and ``anthropic-beta``), as (name, value) pairs.
    wire_headers: tuple[tuple[str, str], ...] = ()


def forwardable(body: dict[str, Any]) -> bytes:
    """The body as JSON for an upstream; one nested too deeply to write is a 400."""
    try:
        return orjson.dumps(body, default=_as_json)
    except orjson.JSONEncodeError:
        raise InvalidRequest(
            f"request body is nested more than {MAX_NESTING} levels deep: cannot forward it"
        ) from None


def _as_json(value: Any) -> orjson.Fragment:
    """Token ids read compactly go out as the JSON text they came in (no int each)."""
    if isinstance(value, TokenIds):
        return orjson.Fragment(value.json)
    raise TypeError(f"{type(value).__name__} is not JSON")
