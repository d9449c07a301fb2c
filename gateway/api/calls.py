"""Inference request bodies: parsed once at the edge into a typed ``Call``.

Only what the gateway acts on is checked (model, messages/prompt, stream options, token
limits, salt); every other field passes through to the upstream untouched, as vLLM and
providers accept many extensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from gateway.errors import BodyTooLarge, InvalidRequest

MAX_INTERACTION_ID = 200
MAX_TOKENS_LIMIT = 1_000_000
MAX_NESTING = 254  # levels of JSON nesting orjson writes (it reads 1024)


class Endpoint(StrEnum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


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


def _optional(body: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is not None and (
        not isinstance(value, kind) or (isinstance(value, bool) and kind is int)
    ):
        raise InvalidRequest(f"'{name}' must be {what}", param=name)
    return value


def _text_size(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text", ""), str)
        )
    return 0


def _prompt_chars(endpoint: Endpoint, body: dict[str, Any]) -> int:
    if endpoint is Endpoint.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("'messages' must be a non-empty array", param="messages")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise InvalidRequest(
                    f"'messages[{index}]' must be an object with a string 'role'",
                    param=f"messages[{index}]",
                )
        return sum(_text_size(m.get("content")) for m in messages)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and (
            all(isinstance(p, str) for p in prompt)
            or all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
        )
    ):
        return sum(len(p) if isinstance(p, str) else 4 for p in prompt)
    raise InvalidRequest(
        "'prompt' must be a string, an array of strings or an array of token ids",
        param="prompt",
    )


def parse_call(endpoint: Endpoint, body: dict[str, Any]) -> Call:
    """Validate what the gateway acts on; raise InvalidRequest with the field named."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    stream = _optional(body, "stream", bool, "a boolean") or False
    options = _optional(body, "stream_options", dict, "an object") or {}
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise InvalidRequest(
            "'stream_options.include_usage' must be a boolean", param="stream_options.include_usage"
        )
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = _optional(body, name, int, "an integer")
        if value is not None and not 1 <= value <= MAX_TOKENS_LIMIT:
            raise InvalidRequest(f"'{name}' must be between 1 and {MAX_TOKENS_LIMIT}", param=name)
    salt = _optional(body, "cache_salt", str, "a string")
    metadata = _optional(body, "metadata", dict, "an object") or {}
    hint = metadata.get("interaction_id")
    if hint is not None and not isinstance(hint, str):
        raise InvalidRequest(
            "'metadata.interaction_id' must be a string", param="metadata.interaction_id"
        )
    return Call(
        endpoint=endpoint,
        model=model,
        body=body,
        stream=stream,
        client_wants_usage=bool(stream and include_usage),
        client_salt=salt,
        interaction_hint=hint,
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
