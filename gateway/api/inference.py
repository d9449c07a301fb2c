"""The inference endpoints, lean Starlette endpoints: /v1/chat/completions,
/v1/completions, /v1/embeddings, /v1/responses, /v1/messages[/count_tokens] and
/v1/models[/{id}].

The Messages endpoints speak Anthropic's wire at the edge too: ``x-api-key`` (beside the
bearer header every endpoint takes), ``anthropic-version`` accepted (vLLM answers in one
version of the wire whichever is asked), and errors in Anthropic's shape.

These are the hot path: the app's ``__call__`` hands them to ``serve``, past FastAPI's
middleware and routing; errors raised here go through the same ``errors.response_for``
as everywhere else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway.api.calls import Call, Endpoint, interaction_id, parse_body, parse_call
from gateway.api.response_ids import ResponseIds
from gateway.api.token_ids import LIFT_BYTES, lift_token_ids
from gateway.auth import Principal
from gateway.config import AnyDeployment
from gateway.errors import BodyTooLarge, MethodNotAllowed, ModelNotFound, response_for
from gateway.serving.calls import served
from gateway.serving.context import Context
from gateway.serving.streaming import LEAVING, tell_when_gone

log = logging.getLogger("kvgate.inference")


# Anthropic's headers that say which version and betas of its wire the client speaks:
# passed on as they came to a hosted Anthropic target (vLLM answers in one version).
WIRE_HEADERS = ("anthropic-version", "anthropic-beta")
LEFT = "kvgate.left"  # in the scope: the handler was cancelled because its client went


class ClientGone(Exception):
    """The client left before its request was read: there is no one to answer."""


async def read_body(request: Request, limit: int) -> bytes | bytearray:
    """The request body, refused as soon as it passes ``limit`` bytes.

    One buffer, grown in place: a body that arrives in one piece (most do) is the server's
    own bytes, uncopied; a larger one is appended into a bytearray, never held twice as
    chunks and their join. A client that hangs up meanwhile is counted and logged in one
    line, and raises ``ClientGone``.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes exceeds the limit of {limit}")
    receive = request.receive
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        first: bytes = message.get("body", b"")
        if len(first) > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        return first
    body = bytearray()
    while message["type"] == "http.request":
        chunk = message.get("body", b"")
        if len(body) + len(chunk) > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        body += chunk
        if not message.get("more_body", False):
            return body
        message = await receive()
    request.app.state.metrics.client_disconnects.labels("body").inc()
    log.info(
        "client gone while its body was read (%d of %s bytes): request %s",
        len(body),
        declared or "unknown",
        request.scope["state"]["request_id"],
    )
    raise ClientGone


async def _inference(endpoint: Endpoint, request: Request) -> Response:
    """One inference call, step by step; serving does the rest of the path (route, call,
    learn, record, respond)."""
    state = request.app.state
    principal = await authenticate(request)
    state.recorder.check_accepting()  # 503 now rather than an answer with no record
    call = await parse(request, endpoint)
    if endpoint is Endpoint.RESPONSES:
        return await _responses(request, principal, call)
    return await _serve(request, principal, call)


async def _serve(request: Request, principal: Principal, call: Call) -> Response:
    state = request.app.state
    deployment = look_up(state.deployments, call.model)
    ctx = context_of(request, principal, deployment, call)
    if deployment.backend != "vllm":
        # A provider bills what it generates whether or not anyone reads it: let it answer,
        # so that the record says what the provider's invoice will.
        return await state.serving.serve(ctx)  # type: ignore[no-any-return]
    # A replica's work is ours: a client that goes before its answer stops it (the server
    # calls LEAVING; the attempt is recorded cancelled). A stream, once it flows, watches
    # for itself (serving/streaming.py).
    scope = request.scope
    tell_when_gone(scope, partial(_left, scope, asyncio.current_task()))
    try:
        return await state.serving.serve(ctx)  # type: ignore[no-any-return]
    finally:
        del scope[LEAVING]


def _left(scope: Scope, task: asyncio.Task[Any] | None) -> None:
    """The client went before its answer was whole: stop the handler's work (``serve``
    then ends quietly)."""
    if task is not None and not task.done():
        scope[LEFT] = True
        task.cancel()


async def _responses(request: Request, principal: Principal, call: Call) -> Response:
    """A Responses call whose response ids are the tenant's own: a follow-up's checked and
    untagged before serving, the answer's tagged (gateway/api/response_ids.py)."""
    ids = ResponseIds(request.app.state.settings.secret)
    previous = call.body.get("previous_response_id")
    followed = None
    if isinstance(previous, str) and previous:
        upstream = ids.untag(principal.tenant_id, previous)
        call.body["previous_response_id"] = upstream
        followed = (upstream, previous)
    response = await _serve(request, principal, call)
    return ids.tagged(response, principal.tenant_id, followed)


async def authenticate(request: Request) -> Principal:
    """The caller, from its API key."""
    headers = request.headers
    authorization = headers.get("authorization")
    if authorization is None and (api_key := headers.get("x-api-key")) is not None:
        authorization = f"Bearer {api_key}"  # Anthropic's SDKs send their key this way
    principal: Principal = await request.app.state.keys.authenticate(authorization)
    return principal


async def parse(request: Request, endpoint: Endpoint) -> Call:
    """The body, read within the size limit and validated into a Call.

    The raw bytes go as soon as they are parsed: they are not held beside the body. A
    large completions prompt of token ids is read into 32-bit words, not an int object
    each (gateway/api/token_ids.py).
    """
    limit = request.app.state.settings.max_body_bytes
    raw = await read_body(request, limit)
    size = len(raw)
    lifted = None
    if endpoint is Endpoint.COMPLETIONS and size >= LIFT_BYTES:
        lifted = lift_token_ids(raw)
    body = lifted if lifted is not None else parse_body(raw, limit)
    del raw
    headers = request.headers
    wire = [(n, headers[n]) for n in WIRE_HEADERS if endpoint.anthropic and n in headers]
    return parse_call(
        endpoint, body, tags_header=headers.get("x-kvgate-tags"), size=size, wire_headers=wire
    )


def look_up(deployments: Mapping[str, AnyDeployment], model: str) -> AnyDeployment:
    """The deployment serving ``model``; 404 in the endpoint's shape if none does."""
    deployment = deployments.get(model)
    if deployment is None:
        raise ModelNotFound(f"The model '{model}' does not exist", param="model")
    return deployment


def context_of(
    request: Request, principal: Principal, deployment: AnyDeployment, call: Call
) -> Context:
    """The request as every attempt of it sees it: ids, caller, deployment, call."""
    request_id = request.scope["state"]["request_id"]
    return Context(
        request_id=request_id,
        interaction_id=interaction_id(request.headers.get("x-interaction-id"), call, request_id),
        principal=principal,
        deployment=deployment,
        call=call,
        traceparent=request.headers.get("traceparent"),
    )


def model_card(name: str, deployment: AnyDeployment, created: int) -> dict[str, Any]:
    """One model as OpenAI's API describes it, with the endpoints that serve it."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "kvgate",
        "endpoints": [str(e) for e in served(deployment)],
    }


async def models(request: Request) -> Response:
    """GET /v1/models: every model this gateway serves."""
    state = request.app.state
    await authenticate(request)
    created = int(state.started_at)
    data = [model_card(n, d, created) for n, d in state.deployments.items()]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


async def model(request: Request) -> Response:
    """GET /v1/models/{id}: one model (ids may hold '/'); 404 if none has that id."""
    state = request.app.state
    await authenticate(request)
    name = request.scope["path"].removeprefix(MODEL_PREFIX)
    card = model_card(name, look_up(state.deployments, name), int(state.started_at))
    return Response(orjson.dumps(card), media_type="application/json")


Handler = Callable[[Request], Awaitable[Response]]


# The inference paths: served by ``serve`` straight from the app's __call__, past
# FastAPI's middleware and routing (about 8% of a request's CPU, measured with py-spy).
# An endpoint's handler is ``_inference`` bound to it: no coroutine between them.
ENDPOINTS: dict[str, tuple[str, Handler]] = {
    **{endpoint.value: ("POST", partial(_inference, endpoint)) for endpoint in Endpoint},
    "/v1/models": ("GET", models),
}
ANTHROPIC_PATHS = frozenset(e.value for e in Endpoint if e.anthropic)
MODEL_PREFIX = "/v1/models/"
ONE_MODEL: tuple[str, Handler] = ("GET", model)


def endpoint_for(path: str) -> tuple[str, Handler] | None:
    """The inference endpoint serving ``path``, if one does."""
    endpoint = ENDPOINTS.get(path)
    if endpoint is None and path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
        return ONE_MODEL
    return endpoint


async def serve(
    endpoint: tuple[str, Handler], scope: Scope, receive: Receive, send: Send, request_id: str
) -> None:
    """One inference request: the handler's response, or its error, mapped once; either
    way with the request's id in ``x-request-id``."""
    method, handler = endpoint
    id_header = (b"x-request-id", request_id.encode())
    started = False

    async def send_with_id(message: Message) -> None:
        nonlocal started
        if not started and message["type"] == "http.response.start":
            started = True
            message["headers"] = [*message.get("headers", ()), id_header]
        await send(message)

    try:
        if scope["method"] != method:
            raise MethodNotAllowed(
                f"{scope['path']} accepts {method} only", headers={"allow": method}
            )
        response = await handler(Request(scope, receive))
        await response(scope, receive, send_with_id)
    except ClientGone:
        return
    except asyncio.CancelledError:
        if not scope.get(LEFT):
            raise
        # Cancelled by _left: the attempt is on record; there is no one left to answer.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return
    except Exception as exc:
        if started:  # a stream already under way: nothing more can be said on it
            raise
        anthropic = scope["path"] in ANTHROPIC_PATHS
        await response_for(exc, anthropic=anthropic)(scope, receive, send_with_id)
