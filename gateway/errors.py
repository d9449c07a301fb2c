"""One error tree, mapped once to OpenAI-style error JSON.

    KvgateError                      (status, type, code)
    ├── InvalidRequest               400 invalid_request_error
    │   ├── BodyTooLarge             413 invalid_request_error / request_too_large
    │   ├── ModelNotFound            404 invalid_request_error / model_not_found
    │   ├── MethodNotAllowed         405 invalid_request_error / method_not_allowed
    │   ├── ResponseUnavailable      404 invalid_request_error / previous_response_unavailable
    │   └── UpstreamRejected         4xx as the upstream said (429 rate_limit_error)
    ├── AuthenticationFailed         401 authentication_error / invalid_api_key
    ├── PermissionDenied             403 permission_error
    ├── NotFound                     404 not_found_error
    ├── BudgetExceeded               402 insufficient_quota / budget_exceeded
    ├── RateLimited                  429 rate_limit_error / rate_limit_exceeded
    ├── Unrecordable                 503 service_unavailable / recorder_unavailable
    ├── KeysUnavailable              503 service_unavailable / keys_unavailable
    ├── SpendUnavailable             503 service_unavailable / budgets_unavailable
    └── UpstreamError                502 upstream_error
        └── UpstreamUnavailable      503 upstream_error / no_healthy_replica

An error with ``retryable`` set happened before any byte of an answer: the request path
may try another attempt. Handlers raise these and never catch; ``install`` maps them (and
FastAPI's validation errors, and anything unexpected) to
``{"error": {"message", "type", "param", "code"}}`` (on the Anthropic endpoints,
``{"type": "error", "error": {"type", "message"}}``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

log = logging.getLogger("kvgate.errors")


class KvgateError(Exception):
    """Any gateway error; a subclass names its ``status``, ``type`` and ``code`` as class
    keywords (``class NotFound(KvgateError, status=404, type="not_found_error")``)."""

    status = 500
    type = "internal_error"
    code: str | None = None
    retryable = False

    def __init_subclass__(
        cls, *, status: int | None = None, type: str | None = None, code: str | None = None
    ) -> None:
        super().__init_subclass__()
        if status is not None:
            cls.status = status
        if type is not None:
            cls.type = type
        if code is not None:
            cls.code = code

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = dict(headers or {})
        if code is not None:
            self.code = code


class InvalidRequest(KvgateError, status=400, type="invalid_request_error"):
    """A request the gateway cannot serve as sent."""


class BodyTooLarge(InvalidRequest, status=413, code="request_too_large"):
    """A body over the size limit."""


class ModelNotFound(InvalidRequest, status=404, code="model_not_found"):
    """A model no route serves."""


class MethodNotAllowed(InvalidRequest, status=405, code="method_not_allowed"):
    """A method the endpoint does not answer."""


class ResponseUnavailable(InvalidRequest, status=404, code="previous_response_unavailable"):
    """A ``previous_response_id`` whose replica (which alone holds it) is gone."""


class ResponseNotFound(InvalidRequest, status=404, code="previous_response_not_found"):
    """A ``previous_response_id`` the caller's tenant was not given (api/response_ids.py)."""


class UpstreamRejected(InvalidRequest):
    """The upstream refused the request (a 4xx): its status and message, in our shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.status = status
        if status == 429:
            self.type = "rate_limit_error"


class AuthenticationFailed(
    KvgateError, status=401, type="authentication_error", code="invalid_api_key"
):
    """No key, or a key the gateway does not know."""


class PermissionDenied(KvgateError, status=403, type="permission_error"):
    """A known key without the right to this endpoint."""


class NotFound(KvgateError, status=404, type="not_found_error"):
    """A tenant, key or other named thing that does not exist."""


class BudgetExceeded(KvgateError, status=402, type="insufficient_quota", code="budget_exceeded"):
    """A budget cannot cover the request's largest possible cost (gateway/budgets.py)."""


class RateLimited(KvgateError, status=429, type="rate_limit_error", code="rate_limit_exceeded"):
    """A tenant's or key's requests or tokens per minute are used up."""


class SpendUnavailable(
    KvgateError, status=503, type="service_unavailable", code="budgets_unavailable"
):
    """Budgets or rate limits apply, and their shared counters cannot be reached."""


class Unrecordable(
    KvgateError, status=503, type="service_unavailable", code="recorder_unavailable"
):
    """The recorder cannot take the request's record."""


class KeysUnavailable(KvgateError, status=503, type="service_unavailable", code="keys_unavailable"):
    """A key the gateway does not know, while it cannot reach the database to look it up:
    never a 401, which would make a client drop a key that may well be valid."""


class UpstreamError(KvgateError, status=502, type="upstream_error"):
    """The upstream failed to answer."""


class UpstreamUnavailable(UpstreamError, status=503, code="no_healthy_replica"):
    """No healthy replica to send the request to."""


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> bytes:
    """An OpenAI-style error body, as JSON bytes."""
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def _json_response(exc: KvgateError, body: bytes) -> Response:
    """A JSON error response with the error's status and headers (``www-authenticate`` on
    401)."""
    headers = {"www-authenticate": "Bearer"} if exc.status == 401 else {}
    headers.update(exc.headers)
    return Response(body, status_code=exc.status, media_type="application/json", headers=headers)


def error_response(exc: KvgateError) -> Response:
    """The error's OpenAI-style response, with its headers (and ``www-authenticate`` on 401)."""
    return _json_response(exc, error_body(exc.message, exc.type, param=exc.param, code=exc.code))


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_type(error: KvgateError) -> str:
    """The Anthropic error type of a gateway error."""
    if error.status in ANTHROPIC_TYPES:
        return ANTHROPIC_TYPES[error.status]
    return "api_error" if error.status >= 500 else "invalid_request_error"


def anthropic_error_response(exc: KvgateError) -> Response:
    """An error in Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``
    (the Messages endpoints' own), with the same status and headers."""
    body = orjson.dumps(
        {"type": "error", "error": {"type": anthropic_type(exc), "message": exc.message}}
    )
    return _json_response(exc, body)


def as_kvgate_error(exc: Exception) -> KvgateError:
    """Any exception as the error clients see: ours as they are, others mapped."""
    if isinstance(exc, KvgateError):
        return exc
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query")]
        message = f"{'.'.join(location) or 'request'}: {first.get('msg', 'invalid request')}"
        return InvalidRequest(message, param=".".join(location) or None)
    if isinstance(exc, HTTPException):
        mapped: dict[int, type[KvgateError]] = {
            401: AuthenticationFailed,
            403: PermissionDenied,
            404: NotFound,
            405: MethodNotAllowed,
            413: BodyTooLarge,
        }
        cls = mapped.get(exc.status_code, InvalidRequest if exc.status_code < 500 else KvgateError)
        error = cls(str(exc.detail), headers=exc.headers)  # a 405's Allow, for one
        error.status = exc.status_code
        return error
    log.exception("unhandled error", exc_info=exc)
    return KvgateError("internal error; the request id is in x-request-id")


def response_for(exc: Exception, *, anthropic: bool = False) -> Response:
    """The error response for any exception, the one mapping: OpenAI's shape, or
    Anthropic's on the Messages endpoints."""
    error = as_kvgate_error(exc)
    return anthropic_error_response(error) if anthropic else error_response(error)


async def _handle(_request: Request, exc: Exception) -> Response:
    return response_for(exc)


def install(app: FastAPI) -> None:
    """Map every error to the OpenAI error shape, once, for the whole app."""
    for kind in (KvgateError, RequestValidationError, HTTPException, Exception):
        app.add_exception_handler(kind, _handle)
