"""Inference request bodies: parsed once at the edge into a typed ``Call``.

Every member the gateway, its prompt renderers or litellm read is checked for its JSON
type here (gateway/api/schemas.py), so a body of any JSON in any position is either a
call or a 400 naming the member; members the gateway does not know pass through to the
upstream untouched, as vLLM and providers accept many extensions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from gateway.api import schemas
from gateway.api.attribution import end_user_of, tags_of
from gateway.api.shapes import Shape, check
from gateway.errors import BodyTooLarge, InvalidRequest
from gateway.routing.token_ids import TokenIds
from gateway.serving.calls import MAX_NESTING, Call, Endpoint, forwardable

__all__ = ["MAX_NESTING", "SCHEMAS", "Call", "Endpoint", "forwardable", "parse_body", "parse_call"]

MAX_INTERACTION_ID = 200
MAX_TOKENS_LIMIT = schemas.MAX_TOKENS_LIMIT
ALWAYS_USAGE = frozenset({Endpoint.RESPONSES, Endpoint.MESSAGES})


SCHEMAS: dict[Endpoint, Shape] = {
    Endpoint.CHAT: schemas.CHAT,
    Endpoint.COMPLETIONS: schemas.COMPLETIONS,
    Endpoint.EMBEDDINGS: schemas.EMBEDDINGS,
    Endpoint.RESPONSES: schemas.RESPONSES,
    Endpoint.MESSAGES: schemas.MESSAGES,
    Endpoint.COUNT_TOKENS: schemas.COUNT_TOKENS,
}


def parse_body(raw: bytes | bytearray, limit: int) -> dict[str, Any]:
    """The body as a JSON object; BodyTooLarge past ``limit`` bytes, InvalidRequest if not one."""
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


def _text_size(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        texts = (p.get("text") for p in content if isinstance(p, dict))
        return sum(len(text) for text in texts if isinstance(text, str))
    return 0


def _prompt_chars(endpoint: Endpoint, body: dict[str, Any]) -> int:
    if endpoint is Endpoint.CHAT:
        return sum(_text_size(m.get("content")) for m in body["messages"])
    if endpoint is Endpoint.RESPONSES:
        items = body["input"]
        size = _text_size(body.get("instructions"))
        if isinstance(items, str):
            return size + len(items)
        return size + sum(_text_size(i.get("content")) for i in items if isinstance(i, dict))
    if endpoint.anthropic:
        messages = body["messages"]
        return _text_size(body.get("system")) + sum(_text_size(m["content"]) for m in messages)
    prompt = body["prompt"] if endpoint is Endpoint.COMPLETIONS else body["input"]
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, TokenIds):
        return 4 * len(prompt)
    return sum(len(p) if isinstance(p, str) else 4 for p in prompt)


def parse_call(
    endpoint: Endpoint,
    body: dict[str, Any],
    *,
    tags_header: str | None = None,
    size: int = 0,
    wire_headers: Sequence[tuple[str, str]] = (),
) -> Call:
    """Check every member's JSON type; raise InvalidRequest with the member named.

    ``tags_header`` is the request's X-Kvgate-Tags (gateway/api/attribution.py); ``size``
    the body's length in bytes as received (the bound budgets reserve against);
    ``wire_headers`` the client's headers of its wire, passed on to same-wire providers.
    """
    shape = SCHEMAS[endpoint]
    check(shape, body)
    model: str = body["model"]
    if not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")

    def member(name: str) -> Any:
        # Only members the endpoint's schema declares (and check() has typed) are read:
        # another endpoint's member (`stream` on embeddings, `stream_options` on Messages)
        # is one the gateway does not know there, and passes through unread.
        return body.get(name) if name in shape.fields else None

    stream = bool(member("stream"))
    options = member("stream_options") or {}
    # The Responses and Messages streams always end with their usage.
    wants_usage = bool(options.get("include_usage")) or endpoint in ALWAYS_USAGE
    metadata = member("metadata") or {}
    return Call(
        endpoint=endpoint,
        model=model,
        body=body,
        stream=stream,
        client_wants_usage=stream and wants_usage,
        client_salt=member("cache_salt"),
        interaction_hint=metadata.get("interaction_id"),
        prompt_chars=_prompt_chars(endpoint, body),
        end_user=(
            end_user_of(metadata.get("user_id"), "metadata.user_id")
            if endpoint.anthropic
            else end_user_of(member("user"))
        ),
        tags=tags_of(tags_header, None if endpoint.anthropic else metadata),
        body_bytes=size,
        wire_headers=tuple(wire_headers),
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
