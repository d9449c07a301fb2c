"""vLLM's other wires, as the simulated replica reads and writes them: embeddings, the
Responses API, and Anthropic's Messages API (with count_tokens).

Prompts are rendered as vLLM renders them, through chat messages
(gateway/routing/conversations.py), and answered by the same engine and prefix cache as
chat; usage is reported in each wire's own convention:

    /v1/embeddings              prompt_tokens, total_tokens (no cached tokens, as vLLM)
    /v1/responses               input_tokens (cached inside), input_tokens_details
                                .cached_tokens, output_tokens, output_tokens_details
    /v1/messages                input_tokens (cached tokens NOT included),
                                cache_read_input_tokens, output_tokens

Streams are vLLM's event sequences (``event:`` and ``data:`` lines).
"""

from __future__ import annotations

import base64
import hashlib
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.routing.conversations import anthropic_messages, responses_messages
from gateway.routing.sim_tokenizer import TemplateError, encode, render_chat
from gateway.tools.sim.protocol import ApiError, BadRequest

EMBEDDING_DIMENSIONS = 16
STORED_RESPONSES = 10_000


class ResponseNotFound(ApiError):
    status = 404
    type = "NotFoundError"


def chat_tokens(messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of chat messages, as the simulated chat template renders them."""
    if not messages:
        raise BadRequest("the prompt renders to no messages")
    try:
        return encode(render_chat(messages))
    except TemplateError as error:
        raise BadRequest(str(error)) from None


# -- embeddings --------------------------------------------------------------------------


def embedding_inputs(body: Mapping[str, Any]) -> list[list[int]]:
    """Each input's token ids: a string, strings, token ids, or lists of token ids."""
    value = body.get("input")
    if isinstance(value, str):
        return [encode(value)]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return [encode(v) for v in value]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [list(value)]
        if all(isinstance(v, list) for v in value):
            return [list(v) for v in value]
    raise BadRequest("'input' must be a string, a list of strings or a list of token ids")


def embedding(tokens: list[int], dimensions: int) -> list[float]:
    """A deterministic unit-free vector of a prompt's tokens."""
    digest = hashlib.shake_256(struct.pack(f"<{len(tokens)}q", *tokens)).digest(4 * dimensions)
    return [round(b / 255 - 0.5, 6) for b in digest[::4]]


def embeddings_body(model: str, body: Mapping[str, Any]) -> bytes:
    """vLLM's /v1/embeddings answer."""
    inputs = embedding_inputs(body)
    dimensions = body.get("dimensions") or EMBEDDING_DIMENSIONS
    if not isinstance(dimensions, int) or dimensions < 1:
        raise BadRequest("'dimensions' must be a positive integer")
    fmt = body.get("encoding_format") or "float"
    data = []
    for index, tokens in enumerate(inputs):
        if not tokens:
            raise BadRequest("The prompt cannot be empty")
        vector: Any = embedding(tokens, dimensions)
        if fmt == "base64":
            vector = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    prompt = sum(len(t) for t in inputs)
    return orjson.dumps(
        {
            "id": "embd-" + uuid.uuid4().hex,
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0},
        }
    )


# -- the Responses API -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored response: the conversation it continued and what it answered."""

    messages: list[dict[str, Any]]
    answer: str


class ResponseStore:
    """The responses a replica stored (``store``, as vLLM's in-memory store), bounded."""

    def __init__(self, size: int = STORED_RESPONSES) -> None:
        self.size = size
        self._stored: OrderedDict[str, Stored] = OrderedDict()

    def put(self, response_id: str, stored: Stored) -> None:
        """Store the response, dropping the oldest past ``size``."""
        self._stored[response_id] = stored
        while len(self._stored) > self.size:
            self._stored.popitem(last=False)

    def get(self, response_id: str) -> Stored:
        """The stored response; ResponseNotFound, in vLLM's words, if there is none."""
        stored = self._stored.get(response_id)
        if stored is None:
            raise ResponseNotFound(f"Response with id '{response_id}' not found.")
        return stored


def responses_prompt(body: Mapping[str, Any], store: ResponseStore) -> list[dict[str, Any]]:
    """A Responses request's chat messages, with the stored conversation it continues."""
    instructions, value = body.get("instructions"), body.get("input")
    if not isinstance(value, str | list):
        raise BadRequest("'input' must be a string or a list of input items")
    messages = responses_messages(instructions, value)
    previous = body.get("previous_response_id")
    if previous is None:
        return messages
    if not isinstance(previous, str):
        raise BadRequest("'previous_response_id' must be a string")
    stored = store.get(previous)
    head = messages[:1] if isinstance(instructions, str) and instructions else []
    history = [m for m in stored.messages if m.get("role") != "system"]
    return [
        *head,
        *history,
        {"role": "assistant", "content": stored.answer},
        *messages[len(head) :],
    ]


def responses_usage(prompt: int, output: int, cached: int) -> dict[str, Any]:
    """The Responses API's usage, as vLLM reports it."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


@dataclass(slots=True)
class ResponseReply:
    """One Responses answer's envelope: the body, or its events in order."""

    id: str
    model: str
    body: Mapping[str, Any]
    created: int
    sequence: int = 0

    @property
    def message_id(self) -> str:
        """The output message's id, made from the response's."""
        return "msg_" + self.id.removeprefix("resp_")

    def response(self, status: str, text: str | None, usage: Any) -> dict[str, Any]:
        """The response object with this status, output text and usage."""
        output = []
        if text is not None:
            part: dict[str, Any] = {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": None,
            }
            output.append(
                {
                    "type": "message",
                    "id": self.message_id,
                    "status": "completed",
                    "role": "assistant",
                    "content": [part],
                }
            )
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "incomplete_details": incomplete,
            "instructions": self.body.get("instructions"),
            "metadata": self.body.get("metadata"),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "previous_response_id": self.body.get("previous_response_id"),
            "store": self.body.get("store", True) is not False,
            "usage": usage,
        }

    def event(self, kind: str, **fields: Any) -> bytes:
        """The stream's next event, numbered in sequence."""
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"

    def opening(self) -> bytes:
        """From response.created to the output text's first part."""
        started = self.response("in_progress", None, None)
        item = {
            "type": "message",
            "id": self.message_id,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        part: dict[str, Any] = {
            "type": "output_text",
            "text": "",
            "annotations": [],
            "logprobs": None,
        }
        return b"".join(
            [
                self.event("response.created", response=started),
                self.event("response.in_progress", response=started),
                self.event("response.output_item.added", output_index=0, item=item),
                self.event(
                    "response.content_part.added",
                    item_id=self.message_id,
                    output_index=0,
                    content_index=0,
                    part=part,
                ),
            ]
        )

    def delta(self, text: str) -> bytes:
        """An output text delta event carrying ``text``."""
        return self.event(
            "response.output_text.delta",
            item_id=self.message_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def closing(self, text: str, usage: dict[str, Any]) -> bytes:
        """From the text's done to response.completed (with the usage)."""
        final = self.response("incomplete", text, usage)
        item = final["output"][0]
        ids = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        return b"".join(
            [
                self.event("response.output_text.done", **ids, text=text, logprobs=[]),
                self.event("response.content_part.done", **ids, part=item["content"][0]),
                self.event("response.output_item.done", output_index=0, item=item),
                self.event("response.completed", response=final),
            ]
        )


# -- Anthropic's Messages API ------------------------------------------------------------


def messages_prompt(body: Mapping[str, Any]) -> list[int]:
    """A Messages request's token ids (system first, then the messages)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of messages")
    return chat_tokens(anthropic_messages(body.get("system"), messages))


def anthropic_usage(prompt: int, output: int, cached: int) -> dict[str, Any]:
    """vLLM's Anthropic usage: ``input_tokens`` without the cached tokens read."""
    return {
        "input_tokens": prompt - cached,
        "output_tokens": output,
        "cache_read_input_tokens": cached,
    }


def anthropic_event(kind: str, data: dict[str, Any]) -> bytes:
    """One Anthropic server-sent event: ``event: KIND``, and its data typed ``KIND``."""
    return f"event: {kind}\n".encode() + b"data: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def anthropic_error(error: ApiError) -> bytes:
    """vLLM's /v1/messages errors, in Anthropic's shape."""
    return orjson.dumps({"type": "error", "error": {"type": error.type, "message": error.message}})
