"""The request bodies of the inference endpoints, as JSON shapes (gateway/api/shapes.py).

Every member the gateway, its prompt renderers (gateway/routing) or litellm read is
typed here as OpenAI's API documents it; members not listed pass through unchecked to
the upstream, which checks its own extensions. ``null`` stands for "not given" wherever
OpenAI's API takes it. An endpoint added later adds its shape to ``SCHEMAS`` (and its
example body to tests/reliability/test_json_types.py).
"""

from __future__ import annotations

from gateway.api.shapes import (
    Shape,
    array,
    boolean,
    either,
    integer,
    mapping,
    nullable,
    number,
    obj,
    string,
    variants,
)

MAX_TOKENS_LIMIT = 1_000_000
MAX_TOKEN_ID = 2**32 - 1
MAX_DIMENSIONS = 65_536  # of an embedding  # token ids are hashed as 32-bit unsigned integers


def _url() -> Shape:
    return obj({"url": string(), "detail": string()}, required=("url",))


def _part(type_: str, **members: Shape) -> Shape:
    return obj({"type": string(type_), **members}, required=("type", *members))


TEXT_PART = _part("text", text=string())
# The parts of a user message: OpenAI's, and the media vLLM and litellm both take.
USER_PARTS = {
    "text": TEXT_PART,
    "image_url": _part("image_url", image_url=_url()),
    "input_audio": _part("input_audio", input_audio=obj({"data": string(), "format": string()})),
    "file": _part(
        "file", file=obj({"file_id": string(), "file_data": string(), "filename": string()})
    ),
    "audio_url": _part("audio_url", audio_url=_url()),
    "video_url": _part("video_url", video_url=_url()),
}
ASSISTANT_PARTS = {"text": TEXT_PART, "refusal": _part("refusal", refusal=string())}


def _parts(kinds: dict[str, Shape]) -> Shape:
    """An array of content parts, each checked as the part its 'type' names."""
    types = ", ".join(f"'{t}'" for t in kinds)
    part = variants(
        obj({"type": string(*kinds)}, required=("type",), what="a content part"), "type", kinds
    )
    return array(part, f"an array of content parts (of type {types})")


def _content(parts: dict[str, Shape], *, optional: bool) -> Shape:
    shape = either(
        string(),
        _parts(parts),
        what="a string or an array of content parts" + (" or null" if optional else ""),
    )
    return nullable(shape) if optional else shape


FUNCTION_CALL = obj(
    {"name": string(), "arguments": string()},
    required=("name", "arguments"),
    what="an object with a string 'name' and string 'arguments'",
)
TOOL_CALL = obj(
    {"id": string(), "type": string(), "function": FUNCTION_CALL},
    required=("id", "type", "function"),
    what="a tool call (an object with 'id', 'type' and 'function')",
)
ROLE = {"role": string(), "name": nullable(string())}
TEXT_CONTENT = _content({"text": TEXT_PART}, optional=False)
# A message is checked by its role, as OpenAI's API defines each; a role it does not
# define (a custom chat template's) is checked as a generic message.
MESSAGE = variants(
    obj(
        {**ROLE, "content": _content({**USER_PARTS, **ASSISTANT_PARTS}, optional=True)},
        required=("role",),
        what="a message (an object with a string 'role')",
    ),
    "role",
    {
        "system": obj({**ROLE, "content": TEXT_CONTENT}, required=("role", "content")),
        "developer": obj({**ROLE, "content": TEXT_CONTENT}, required=("role", "content")),
        "user": obj(
            {**ROLE, "content": _content(USER_PARTS, optional=False)},
            required=("role", "content"),
        ),
        "assistant": obj(
            {
                **ROLE,
                "content": _content(ASSISTANT_PARTS, optional=True),
                "tool_calls": nullable(array(TOOL_CALL, "an array of tool calls")),
                "function_call": nullable(FUNCTION_CALL),
                "refusal": nullable(string()),
            },
            required=("role",),
        ),
        "tool": obj(
            {**ROLE, "content": TEXT_CONTENT, "tool_call_id": string()},
            required=("role", "content", "tool_call_id"),
        ),
        "function": obj(
            {"role": string(), "name": string(), "content": nullable(string())},
            required=("role", "name"),
        ),
    },
)
FUNCTION = obj(
    {
        "name": string(),
        "description": nullable(string()),
        "parameters": nullable(obj({})),
        "strict": nullable(boolean()),
    },
    required=("name",),
    what="a function (an object with a string 'name')",
)
TOOL = obj(
    {"type": string("function"), "function": FUNCTION},
    required=("type", "function"),
    what="a tool (an object with 'type' and 'function')",
)
TOOL_CHOICE = either(
    string(),
    obj(
        {"type": string(), "function": obj({"name": string()}, required=("name",))},
        required=("type",),
    ),
    what="a string or an object",
)
JSON_SCHEMA_FORMAT = obj(
    {
        "name": string(),
        "description": nullable(string()),
        # 'schema' is required: litellm reads it unconditionally.
        "schema": obj({}),
        "strict": nullable(boolean()),
    },
    required=("name", "schema"),
)
# Checked by its 'type'; a type OpenAI does not define (an engine's own, such as vLLM's
# 'structural_tag') passes to the upstream, which checks it.
RESPONSE_FORMAT = variants(
    obj({"type": string()}, required=("type",), what="an object with a string 'type'"),
    "type",
    {
        "text": obj({"type": string("text")}, required=("type",)),
        "json_object": obj({"type": string("json_object")}, required=("type",)),
        "json_schema": obj(
            {"type": string("json_schema"), "json_schema": JSON_SCHEMA_FORMAT},
            required=("type", "json_schema"),
        ),
    },
)
STOP = either(
    string(),
    array(string(), "an array of strings"),
    what="a string, an array of strings or null",
)
STREAM_OPTIONS = obj(
    {"include_usage": nullable(boolean()), "continuous_usage_stats": nullable(boolean())}
)
METADATA = obj({"interaction_id": nullable(string())})
TOKEN_LIMIT = integer(1, MAX_TOKENS_LIMIT)

# What both endpoints take.
COMMON: dict[str, Shape] = {
    "model": string(),
    "stream": nullable(boolean()),
    "stream_options": nullable(STREAM_OPTIONS),
    "max_tokens": nullable(TOKEN_LIMIT),
    "n": nullable(TOKEN_LIMIT),
    "temperature": nullable(number()),
    "top_p": nullable(number()),
    "frequency_penalty": nullable(number()),
    "presence_penalty": nullable(number()),
    "logit_bias": nullable(mapping(number(), "an object of numbers")),
    "seed": nullable(integer()),
    "stop": nullable(STOP),
    "user": nullable(string()),
    "cache_salt": nullable(string()),
    "metadata": nullable(METADATA),
    "service_tier": nullable(string()),
}

CHAT = obj(
    {
        **COMMON,
        "messages": array(MESSAGE, "a non-empty array", min_items=1),
        "max_completion_tokens": nullable(TOKEN_LIMIT),
        "logprobs": nullable(boolean()),
        "top_logprobs": nullable(integer()),
        "tools": nullable(array(TOOL, "an array of tools")),
        "tool_choice": nullable(TOOL_CHOICE),
        "parallel_tool_calls": nullable(boolean()),
        "response_format": nullable(RESPONSE_FORMAT),
        "functions": nullable(array(FUNCTION, "an array of functions")),
        "function_call": nullable(TOOL_CHOICE),
        "modalities": nullable(array(string(), "an array of strings")),
        "reasoning_effort": nullable(string()),
        "store": nullable(boolean()),
    },
    required=("model", "messages"),
)

PROMPT = either(
    string(),
    array(
        either(string(), integer(0, MAX_TOKEN_ID), what="a string or a token id"),
        "an array of strings or an array of token ids",
        min_items=1,
        uniform=True,
    ),
    what="a string, an array of strings or an array of token ids",
)
COMPLETIONS = obj(
    {
        **COMMON,
        "prompt": PROMPT,
        "echo": nullable(boolean()),
        "logprobs": nullable(integer()),
        "best_of": nullable(integer()),
        "suffix": nullable(string()),
    },
    required=("model", "prompt"),
)

# -- /v1/embeddings ----------------------------------------------------------------------

EMBEDDINGS = obj(
    {
        "model": string(),
        "input": PROMPT,
        "encoding_format": nullable(string("float", "base64")),
        "dimensions": nullable(integer(1, MAX_DIMENSIONS)),
        "user": nullable(string()),
        "cache_salt": nullable(string()),
    },
    required=("model", "input"),
)

# -- /v1/responses (OpenAI's Responses API) -------------------------------------------------

_RESPONSE_PART = variants(
    obj({"type": string()}, required=("type",), what="a content part (an object with 'type')"),
    "type",
    {
        "input_text": _part("input_text", text=string()),
        "output_text": _part("output_text", text=string()),
    },
)
_RESPONSE_CONTENT = either(
    string(),
    array(_RESPONSE_PART, "an array of content parts"),
    what="a string or an array of content parts",
)
_RESPONSE_MESSAGE = obj(
    {"type": string(), "role": string(), "content": _RESPONSE_CONTENT},
    required=("role", "content"),
    what="an input item (an object)",
)
# Items are checked by their 'type' (a message when it has none); a type not listed (a
# reasoning item, a tool's) passes to the replica, which checks it.
RESPONSE_ITEM = variants(
    obj(
        {"type": string(), "role": string(), "content": _RESPONSE_CONTENT},
        what="an input item (an object)",
    ),
    "type",
    {
        "message": _RESPONSE_MESSAGE,
        "function_call": obj(
            {"type": string(), "call_id": string(), "name": string(), "arguments": string()},
            required=("call_id", "name", "arguments"),
        ),
        "function_call_output": obj(
            {"type": string(), "call_id": string(), "output": string()},
            required=("call_id", "output"),
        ),
    },
)
# Tools are checked by their 'type'; the built-in ones (web_search, file_search…) pass to
# the upstream, which checks them.
RESPONSE_TOOL = variants(
    obj({"type": string()}, required=("type",), what="a tool (an object with 'type')"),
    "type",
    {
        "function": obj(
            {
                "type": string(),
                "name": string(),
                "description": nullable(string()),
                "parameters": nullable(obj({})),
                "strict": nullable(boolean()),
            },
            required=("type", "name"),
        ),
    },
)
RESPONSES = obj(
    {
        "model": string(),
        "input": either(
            string(),
            array(RESPONSE_ITEM, "an array of input items"),
            what="a string or an array of input items",
        ),
        "instructions": nullable(string()),
        "stream": nullable(boolean()),
        "store": nullable(boolean()),
        "previous_response_id": nullable(string()),
        "max_output_tokens": nullable(TOKEN_LIMIT),
        "temperature": nullable(number()),
        "top_p": nullable(number()),
        "tools": nullable(array(RESPONSE_TOOL, "an array of tools")),
        "metadata": nullable(METADATA),
        "user": nullable(string()),
        "cache_salt": nullable(string()),
    },
    required=("model", "input"),
)

# -- /v1/messages, /v1/messages/count_tokens (Anthropic's Messages API) ---------------------

CACHE_CONTROL = nullable(obj({"type": string(), "ttl": string()}, required=("type",)))
_TEXT_BLOCK = obj(
    {"type": string("text"), "text": string(), "cache_control": CACHE_CONTROL},
    required=("type", "text"),
)
# Blocks are checked by their 'type'; others (images, tool results, thinking) pass to the
# replica, which checks them.
CONTENT_BLOCK = variants(
    obj({"type": string()}, required=("type",), what="a content block (an object with 'type')"),
    "type",
    {"text": _TEXT_BLOCK},
)
ANTHROPIC_MESSAGE = obj(
    {
        "role": string(),
        "content": either(
            string(),
            array(CONTENT_BLOCK, "an array of content blocks"),
            what="a string or an array of content blocks",
        ),
    },
    required=("role", "content"),
    what="a message (an object with 'role' and 'content')",
)
ANTHROPIC_TOOL = obj(
    {
        "name": string(),
        "description": string(),
        "input_schema": obj({}),
        "cache_control": CACHE_CONTROL,
    },
    required=("name",),
    what="a tool (an object with a string 'name')",
)
_ANTHROPIC_PROMPT: dict[str, Shape] = {
    "model": string(),
    "messages": array(ANTHROPIC_MESSAGE, "a non-empty array of messages", min_items=1),
    "system": nullable(
        either(
            string(),
            array(_TEXT_BLOCK, "an array of text blocks"),
            what="a string or an array of text blocks",
        )
    ),
    "tools": nullable(array(ANTHROPIC_TOOL, "an array of tools")),
    "cache_salt": nullable(string()),
}
MESSAGES = obj(
    {
        **_ANTHROPIC_PROMPT,
        "max_tokens": TOKEN_LIMIT,
        "stream": nullable(boolean()),
        "temperature": nullable(number()),
        "top_p": nullable(number()),
        "top_k": nullable(integer()),
        "stop_sequences": nullable(array(string(), "an array of strings")),
        "metadata": nullable(
            obj({"user_id": nullable(string()), "interaction_id": nullable(string())})
        ),
    },
    required=("model", "messages", "max_tokens"),
)
COUNT_TOKENS = obj(_ANTHROPIC_PROMPT, required=("model", "messages"))
