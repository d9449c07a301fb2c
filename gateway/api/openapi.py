"""The gateway's OpenAPI document: FastAPI's routes, plus the inference paths it never sees.

The inference paths are served straight from the app's ``__call__`` (see app.py), so
FastAPI's schema would leave them out; they are described here instead, by hand, with only
what ``calls.parse_call`` checks (every other field passes through to the upstream). Every
error, everywhere, is documented as the one shape ``errors.py`` writes (on the Messages
endpoints, Anthropic's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict

from gateway.api.calls import MAX_INTERACTION_ID, MAX_TOKENS_LIMIT

REF = "#/components/schemas/"
TENANT_KEY = "TenantKey"
ADMIN_TOKEN = "AdminToken"


class ErrorDetail(BaseModel):
    """What went wrong: OpenAI's error object."""

    model_config = ConfigDict(extra="forbid")
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error the gateway answers, whatever the endpoint and status."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorDetail


ERRORS: dict[int, str] = {
    400: "The request is invalid; `param` names the field at fault.",
    401: "Missing, malformed, unknown or revoked key (or, on /v1/admin, not the admin token).",
    404: "No such model, or no tenant of that name.",
    413: "The request body is larger than KVGATE_MAX_BODY_BYTES.",
    502: "The upstream failed.",
    503: "No healthy upstream, the gateway cannot record requests right now, or it cannot "
    "check a key it does not know while its database is unreachable (`keys_unavailable`).",
}


class AnthropicErrorDetail(BaseModel):
    """What went wrong: Anthropic's error object."""

    model_config = ConfigDict(extra="forbid")
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Every error of the Messages endpoints (Anthropic's shape)."""

    model_config = ConfigDict(extra="forbid")
    type: str
    error: AnthropicErrorDetail


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Error responses to document on a FastAPI router or route."""
    return {s: {"model": ErrorResponse, "description": ERRORS[s]} for s in statuses}


def _error_responses(statuses: Iterable[int], shape: str = "ErrorResponse") -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": REF + shape}}}
    return {str(s): {"description": ERRORS[s], "content": content} for s in statuses}


def _token_limit(name: str) -> dict[str, Any]:
    return {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_TOKENS_LIMIT,
        "description": f"Passed to the upstream; {name} outside 1..{MAX_TOKENS_LIMIT} is a 400.",
    }


def _request(required: list[str], prompt: dict[str, Any]) -> dict[str, Any]:
    """An inference body: the fields the gateway reads; any other passes through."""
    return {
        "type": "object",
        "required": required,
        "additionalProperties": True,
        "properties": {
            **prompt,
            "stream": {"type": "boolean"},
            "stream_options": {
                "type": "object",
                "properties": {"include_usage": {"type": "boolean"}},
            },
            "max_tokens": _token_limit("max_tokens"),
            "max_completion_tokens": _token_limit("max_completion_tokens"),
            "n": _token_limit("n"),
            "cache_salt": {
                "type": "string",
                "description": "Folded in under the tenant's own salt: never shared across "
                "tenants.",
            },
            "metadata": {
                "type": "object",
                "properties": {"interaction_id": {"type": "string"}},
            },
        },
    }


MESSAGE = {
    "type": "object",
    "required": ["role"],
    "additionalProperties": True,
    "properties": {
        "role": {"type": "string", "minLength": 1},
        "content": {"anyOf": [{"type": "string"}, {"type": "array"}, {"type": "null"}]},
    },
}
PROMPT = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
        {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
    ]
}
USAGE = {
    "type": "object",
    "additionalProperties": True,
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "prompt_tokens_details": {
            "type": "object",
            "properties": {"cached_tokens": {"type": "integer"}},
        },
        "cost": {
            "type": ["string", "null"],
            "description": "USD, exact to the nano-dollar; null when the model has no price.",
        },
    },
}
COMPLETION = {
    "type": "object",
    "required": ["choices"],
    "additionalProperties": True,
    "properties": {
        "id": {"type": "string"},
        "choices": {"type": "array"},
        "usage": {"$ref": REF + "Usage"},
    },
}
MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by", "endpoints"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "endpoints": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The inference endpoints that serve this model.",
        },
    },
}
MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {"$ref": REF + "Model"}},
    },
}
INTERACTION_HEADER = {
    "name": "X-Interaction-Id",
    "in": "header",
    "required": False,
    "description": "Groups attempts and turns into one interaction (default: the request id).",
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_INTERACTION_ID},
}
STREAM_EVENT = {
    "type": "object",
    "description": "One server-sent event (the schema describes each event, not the stream).",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "string",
            "description": "A JSON chunk; the usage chunk (`usage.cost` added) when asked for "
            "with `stream_options.include_usage`; an `error` object if the upstream failed; "
            "`[DONE]` last.",
        }
    },
}


def _examples(model: str, prompt: dict[str, Any]) -> dict[str, Any]:
    plain = {"model": model, **prompt, "max_tokens": 8}
    streamed = {**plain, "stream": True, "stream_options": {"include_usage": True}}
    return {"plain": {"value": plain}, "streamed": {"value": streamed}}


def _inference(
    summary: str,
    request: str,
    response: str,
    examples: dict[str, Any],
    *,
    error: str = "ErrorResponse",
    stream: bool = True,
) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": {"$ref": REF + response}}}
    if stream:
        content["text/event-stream"] = {"schema": STREAM_EVENT}
    return {
        "post": {
            "tags": ["inference"],
            "summary": summary,
            "operationId": request.removesuffix("Request").lower(),
            "security": [{TENANT_KEY: []}],
            "parameters": [INTERACTION_HEADER],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": REF + request}, "examples": examples}
                },
            },
            "responses": {
                "200": {
                    "description": "The upstream's answer, with `usage.cost` added.",
                    "content": content,
                },
                **_error_responses((400, 401, 404, 413, 502, 503), error),
            },
        }
    }


def _paths(models: list[str], text_models: list[str]) -> dict[str, Any]:
    chat_model = models[0] if models else "my-model"
    text_model = text_models[0] if text_models else "my-model"
    return {
        "/v1/chat/completions": _inference(
            "Chat completion, routed and priced",
            "ChatCompletionRequest",
            "ChatCompletion",
            _examples(chat_model, {"messages": [{"role": "user", "content": "Say hello."}]}),
        ),
        "/v1/completions": _inference(
            "Text completion, routed and priced",
            "CompletionRequest",
            "Completion",
            _examples(text_model, {"prompt": "Once upon a time"}),
        ),
        "/v1/embeddings": _inference(
            "Embeddings, priced at the input rate",
            "EmbeddingsRequest",
            "Embeddings",
            {"plain": {"value": {"model": text_model, "input": "Say hello."}}},
            stream=False,
        ),
        "/v1/responses": _inference(
            "OpenAI Responses API, routed and priced (every model: translated into chat for "
            "hosted ones whose provider does not speak it)",
            "ResponsesRequest",
            "Response",
            {
                "plain": {"value": {"model": text_model, "input": "Say hello."}},
                "streamed": {"value": {"model": text_model, "input": "Hi.", "stream": True}},
            },
        ),
        "/v1/messages": _inference(
            "Anthropic Messages API, routed and priced (every model: translated into chat for "
            "hosted ones whose provider does not speak it)",
            "MessagesRequest",
            "Message",
            {"plain": {"value": {**ANTHROPIC_EXAMPLE, "model": text_model, "max_tokens": 8}}},
            error="AnthropicErrorResponse",
        ),
        "/v1/messages/count_tokens": _inference(
            "Anthropic Messages API: a prompt's input tokens (not billed)",
            "CountTokensRequest",
            "TokenCount",
            {"plain": {"value": {**ANTHROPIC_EXAMPLE, "model": text_model}}},
            error="AnthropicErrorResponse",
            stream=False,
        ),
        "/v1/models": {
            "get": {
                "tags": ["inference"],
                "summary": "The models this gateway serves",
                "operationId": "models",
                "security": [{TENANT_KEY: []}],
                "responses": {
                    "200": {
                        "description": "The models, OpenAI's list shape.",
                        "content": {"application/json": {"schema": {"$ref": REF + "ModelList"}}},
                    },
                    **_error_responses((401,)),
                },
            }
        },
        "/v1/models/{model}": {
            "get": {
                "tags": ["inference"],
                "summary": "One model this gateway serves",
                "operationId": "model",
                "security": [{TENANT_KEY: []}],
                "parameters": [
                    {
                        "name": "model",
                        "in": "path",
                        "required": True,
                        "description": "The model's id; it may hold '/'.",
                        "schema": {"type": "string", "minLength": 1},
                    }
                ],
                "responses": {
                    "200": {
                        "description": "The model, OpenAI's model shape.",
                        "content": {"application/json": {"schema": {"$ref": REF + "Model"}}},
                    },
                    **_error_responses((401, 404)),
                },
            }
        },
    }


ITEM = {"type": "object", "additionalProperties": True}
ANTHROPIC_EXAMPLE = {"messages": [{"role": "user", "content": "Say hello."}]}
ANTHROPIC_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "additionalProperties": True,
    "properties": {
        "role": {"type": "string", "minLength": 1},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": ITEM}]},
    },
}


def _object(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    """A body of the later endpoints: the fields the gateway reads; others pass through."""
    return {
        "type": "object",
        "required": required,
        "additionalProperties": True,
        "properties": properties,
    }


def _anthropic(models: list[str]) -> dict[str, Any]:
    return {
        "model": _model(models),
        "messages": {"type": "array", "minItems": 1, "items": ANTHROPIC_MESSAGE},
        "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": ITEM}]},
    }


def _answer(required: list[str], usage: str | None) -> dict[str, Any]:
    properties: dict[str, Any] = {name: {} for name in required}
    if usage is not None:
        properties[usage] = {
            "type": "object",
            "additionalProperties": True,
            "properties": {"cost": USAGE["properties"]["cost"]},  # type: ignore[index]
        }
    return _object(required, properties)


def _model(names: list[str]) -> dict[str, Any]:
    model: dict[str, Any] = {"type": "string", "minLength": 1}
    if names:
        model["enum"] = names  # any other name is a 404 (or a 400: chat only)
    return model


def _schemas(models: list[str], text_models: list[str]) -> dict[str, Any]:
    messages = {"type": "array", "minItems": 1, "items": MESSAGE}
    return {
        "ChatCompletionRequest": _request(
            ["model", "messages"], {"model": _model(models), "messages": messages}
        ),
        "CompletionRequest": _request(
            ["model", "prompt"], {"model": _model(text_models), "prompt": PROMPT}
        ),
        "EmbeddingsRequest": _object(
            ["model", "input"], {"model": _model(text_models), "input": PROMPT}
        ),
        "ResponsesRequest": _object(
            ["model", "input"],
            {
                "model": _model(models),
                "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": ITEM}]},
                "instructions": {"type": "string"},
                "stream": {"type": "boolean"},
                "previous_response_id": {
                    "type": "string",
                    "description": "An id this tenant was given, served where it is stored; "
                    "a 404 if it is gone or not the tenant's (`previous_response_not_found`), "
                    "a 400 on a model that stores nothing (translated into chat).",
                },
                "max_output_tokens": _token_limit("max_output_tokens"),
            },
        ),
        "MessagesRequest": _object(
            ["model", "messages", "max_tokens"],
            {
                **_anthropic(models),
                "max_tokens": _token_limit("max_tokens"),
                "stream": {"type": "boolean"},
            },
        ),
        "CountTokensRequest": _object(["model", "messages"], _anthropic(text_models)),
        "Embeddings": _answer(["data"], "usage"),
        "Response": _answer(["output"], "usage"),
        "Message": _answer(["content"], "usage"),
        "TokenCount": _answer(["input_tokens"], None),
        "Usage": USAGE,
        "ChatCompletion": COMPLETION,
        "Completion": COMPLETION,
        "Model": MODEL,
        "ModelList": MODEL_LIST,
    }


def document(
    schema: dict[str, Any], *, models: list[str], text_models: list[str]
) -> dict[str, Any]:
    """FastAPI's ``schema``, completed: inference paths, bearer auth, errors as they are sent.

    ``models`` are served on /v1/chat/completions; ``text_models`` (vLLM's) on
    /v1/completions too: models reached through litellm are chat only.

    FastAPI documents its validation errors as 422 ``HTTPValidationError``; errors.py
    answers them 400 in the one error shape, so that is what is documented.
    """
    paths = {**_paths(models, text_models), **schema.get("paths", {})}
    for item in paths.values():
        for operation in item.values():
            operation["responses"].pop("422", None)
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    error = ErrorResponse.model_json_schema(ref_template=REF + "{model}")
    anthropic = AnthropicErrorResponse.model_json_schema(ref_template=REF + "{model}")
    schemas.update(error.pop("$defs"), ErrorResponse=error, **_schemas(models, text_models))
    schemas.update(anthropic.pop("$defs"), AnthropicErrorResponse=anthropic)
    components["securitySchemes"] = {
        TENANT_KEY: {"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
        ADMIN_TOKEN: {"type": "http", "scheme": "bearer", "description": "KVGATE_ADMIN_TOKEN."},
    }
    schema["paths"] = paths
    return schema
