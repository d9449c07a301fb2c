"""vLLM's OpenAI wire format, as the simulated replica reads and writes it.

Request bodies are checked by hand (no pydantic on the simulator's hot path) into frozen
values; every bad shape is an `ApiError`, which the server turns into vLLM's error JSON
``{"error": {"message", "type", "param", "code"}}``, never a 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.routing.sim_tokenizer import VOCAB_SIZE, TemplateError, encode, render_chat

DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
    """An error answer: HTTP status and vLLM's error type name."""

    status = 400
    type = "BadRequestError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> bytes:
        """vLLM's error JSON."""
        error = {"message": self.message, "type": self.type, "param": None, "code": self.status}
        return orjson.dumps({"error": error})


class BadRequest(ApiError):
    status = 400
    type = "BadRequestError"


class ModelNotFound(ApiError):
    status = 404
    type = "NotFoundError"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A valid generation request: what the engine needs and how to answer."""

    prompt_token_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    cache_salt: str | None


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"Invalid JSON body: {error}") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object")
    return body


def check_model(body: Mapping[str, Any], served: str) -> None:
    """An absent model means the served one; any other name is unknown."""
    model = body.get("model")
    if model is not None and model != served:
        raise ModelNotFound(f"The model `{model}` does not exist.")


def chat_prompt(body: Mapping[str, Any], *, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a chat request's rendered messages."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of messages")
    if not all(isinstance(message, dict) for message in messages):
        raise BadRequest("each item of 'messages' must be an object")
    try:
        text = render_chat(messages, add_generation_prompt=add_generation_prompt)
    except TemplateError as error:
        raise BadRequest(str(error)) from None
    return encode(text)


def completion_prompt(body: Mapping[str, Any]) -> list[int]:
    """Token ids of a completion request's prompt: a string or a list of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = encode(prompt)
    elif isinstance(prompt, list) and all(_is_int(item) for item in prompt):
        ids = prompt
        for token in ids:
            if not 0 <= token < VOCAB_SIZE:
                raise BadRequest(f"Token id {token} is out of vocabulary")
    else:
        raise BadRequest("'prompt' must be a string or a list of token ids")
    if not ids:
        raise BadRequest("The prompt cannot be empty")
    return ids


def parse_generation(
    body: Mapping[str, Any], prompt: list[int], *, max_model_len: int
) -> ParsedRequest:
    """The generation options shared by chat and completions, checked against the context."""
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest("'max_tokens' must be an integer of at least 1")
    stream = _optional(body, "stream", bool, False)
    options = _optional(body, "stream_options", dict, None)
    if options is not None and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    include_usage = _optional(options or {}, "include_usage", bool, False)
    salt = _optional(body, "cache_salt", str, None)
    if salt == "":
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
    n = _optional(body, "n", int, 1)
    if n != 1:
        raise BadRequest("The simulator supports only n=1")
    stop = body.get("stop")
    if not (stop is None or isinstance(stop, str) or _is_str_list(stop)):
        raise BadRequest("'stop' must be a string or a list of strings")
    _check_length(len(prompt), max_tokens, max_model_len)
    return ParsedRequest(prompt, max_tokens, stream, include_usage, salt)


def usage(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    by_source: dict[str, int] | None = None,
) -> dict[str, Any]:
    """vLLM's usage object (with --enable-prompt-tokens-details).

    ``by_source``: cached tokens by the tier that served them, under vLLM's cache hit
    source names (device, host, disk), as ``prompt_tokens_details.cached_tokens_by_source``:
    the simulator's own addition, made only when it has lower tiers (vLLM 0.32 counts
    tiers in its metrics only, never per request).
    """
    details: dict[str, Any] = {"cached_tokens": cached_tokens}
    if by_source is not None:
        details["cached_tokens_by_source"] = by_source
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": details,
    }


@dataclass(frozen=True, slots=True)
class Reply:
    """The envelope of one answer: builds the response body or its SSE chunks."""

    id: str
    created: int
    model: str
    chat: bool

    def body(self, text: str, finish_reason: str, usage: dict[str, Any]) -> bytes:
        """The non-streaming response."""
        if self.chat:
            message = {"role": "assistant", "content": text, "tool_calls": []}
            choice: dict[str, Any] = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None)
        return orjson.dumps(
            {
                "id": self.id,
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            }
        )

    def role_event(self, include_usage: bool) -> bytes:
        """The first chat chunk, which names the role."""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._event([choice], include_usage)

    def token_event(self, text: str, finish_reason: str | None, include_usage: bool) -> bytes:
        """One chunk carrying output text (and the finish reason on the last one)."""
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = None
        return self._event([choice], include_usage)

    def usage_event(self, usage: dict[str, Any]) -> bytes:
        """The closing chunk of ``stream_options.include_usage``: no choices, the usage."""
        return b"data: " + orjson.dumps(self._chunk([], usage)) + b"\n\n"

    def _event(self, choices: list[dict[str, Any]], include_usage: bool) -> bytes:
        chunk = self._chunk(choices, None)
        if not include_usage:
            del chunk["usage"]
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _chunk(self, choices: list[dict[str, Any]], usage: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        }


DONE_EVENT = b"data: [DONE]\n\n"


def _check_length(prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    if prompt_tokens >= max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_tokens} input tokens. Please reduce the length of the "
            "input messages."
        )
    if prompt_tokens + max_tokens > max_model_len:
        raise BadRequest(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
            f"model's maximum context length is {max_model_len} tokens and your request has "
            f"{prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {prompt_tokens})."
        )


def _optional(body: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    # bool is an int in Python, but not in JSON.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"'{key}' must be of type {kind.__name__}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
