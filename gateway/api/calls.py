"""Inference request bodies: parsed once at the edge into a typed ``Call``.

Every member the gateway, its prompt renderers or litellm read is checked for its JSON
type here (gateway/api/schemas.py), so a body of any JSON in any position is either a
call or a 400 naming the member; members the gateway does not know pass through to the
upstream untouched, as vLLM and providers accept many extensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from gateway.api import schemas
from gateway.api.shapes import Shape, check
from gateway.errors import BodyTooLarge, InvalidRequest

MAX_INTERACTION_ID = 200
MAX_TOKENS_LIMIT = schemas.MAX_TOKENS_LIMIT
MAX_NESTING = 254  # levels of JSON nesting orjson writes (it reads 1024)


class Endpoint(StrEnum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


SCHEMAS: dict[Endpoint, Shape] = {
    Endpoint.CHAT: schemas.CHAT,
    Endpoint.COMPLETIONS: schemas.COMPLETIONS,
}


@dataclass(frozen=True, slots=True)
class Call:
    """One inference request as the gateway understands it.

    ``body`` is the client's JSON object. The vLLM path empties it once it has encoded its
    upstream body and routed the prompt (a large body is then not held twice).
    """

    endpoint: Endpoint
    model: str
    body: dict[str, Any]
    stream: bool
    client_wants_usage: bool
    client_salt: str | None
    interaction_hint: str | None
    prompt_chars: int


def parse_body(raw: bytes | bytearray, limit: int) -> dict[str, Any]:
    if len(raw) > limit:
        raise BodyTooLarge(f"request body of {len(raw)} bytes exceeds the limit of {limit}")
    if not raw:
        raise InvalidRequest("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def forwardable(body: dict[str, Any]) -> bytes:
    """The body as JSON for an upstream; one nested too deeply to write is a 400."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        raise InvalidRequest(
            f"request body is nested more than {MAX_NESTING} levels deep: cannot forward it"
        ) from None


def _text_size(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text") or "") for p in content)
    return 0


def _prompt_chars(endpoint: Endpoint, body: dict[str, Any]) -> int:
    if endpoint is Endpoint.CHAT:
        return sum(_text_size(m.get("content")) for m in body["messages"])
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) if isinstance(p, str) else 4 for p in prompt)


def parse_call(endpoint: Endpoint, body: dict[str, Any]) -> Call:
    """Check every member's JSON type; raise InvalidRequest with the member named."""
    check(SCHEMAS[endpoint], body)
    model: str = body["model"]
    if not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    stream = bool(body.get("stream"))
    options = body.get("stream_options") or {}
    metadata = body.get("metadata") or {}
    return Call(
        endpoint=endpoint,
        model=model,
        body=body,
        stream=stream,
        client_wants_usage=stream and bool(options.get("include_usage")),
        client_salt=body.get("cache_salt"),
        interaction_hint=metadata.get("interaction_id"),
        prompt_chars=_prompt_chars(endpoint, body),
    )


def interaction_id(header: str | None, call: Call, request_id: str) -> str:
    """Header first, then metadata.interaction_id, else the request id.

    Ids are stored and shown: printable characters only (Postgres refuses NUL outright, and
    one unwritable record would hold back every record journaled after it).
    """
    if header is not None:
        value, param = header, "X-Interaction-Id"
    elif call.interaction_hint is not None:
        value, param = call.interaction_hint, "metadata.interaction_id"
    else:
        return request_id
    value = value.strip()
    if not value or len(value) > MAX_INTERACTION_ID or not value.isprintable():
        raise InvalidRequest(
            f"interaction id must be 1 to {MAX_INTERACTION_ID} printable characters",
            param=param,
        )
    return value
