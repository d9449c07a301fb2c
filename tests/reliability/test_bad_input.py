"""Hostile and malformed input: a clear 4xx in OpenAI's error shape, and no secret logged.

tests/e2e/test_gateway.py already covers malformed JSON, wrong types, an oversized body
sent whole, 5000-deep arrays, unknown models and a wrong method's 405; these go further:
bodies streamed past the limit or declared past it, nesting the gateway can parse but not
forward, invalid UTF-8, absurd token limits, unknown fields, control characters in ids,
the calendar's last day, the Allow header of every 405.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.reliability.conftest import (
    MAX_BODY,
    MODEL,
    PROVIDER_MODEL,
    Stack,
    call,
    error_of,
    nothing_secret_logged,
)
from tests.support.processes import wait_recorded

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hello"}]


def auth(stack: Stack, tenant: str = "alpha") -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.keys[tenant]}", "content-type": "application/json"}


def post(stack: Stack, body: bytes, path: str = CHAT, **headers: str) -> tuple[int, bytes]:
    status, _, reply = call(stack.url + path, body, {**auth(stack), **headers})
    return status, reply


def chat(**fields: Any) -> bytes:
    # json, not orjson: the absurd values include integers past 64 bits.
    body = {"model": MODEL, "messages": USER, "max_tokens": 2, **fields}
    return json.dumps(body).encode()


def raw_http(stack: Stack, head: bytes, chunks: list[bytes]) -> tuple[int, bytes]:
    """Send a request head and body pieces as they are, and read the answer."""
    address = urlsplit(stack.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    connection.connect()
    assert connection.sock is not None
    connection.sock.sendall(head)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for chunk in chunks:
            connection.sock.sendall(chunk)
    response = http.client.HTTPResponse(connection.sock, method="POST")
    response.begin()
    body = response.read()
    connection.close()
    return response.status, body


def head(stack: Stack, extra: str) -> bytes:
    key = stack.keys["alpha"]
    return (
        f"POST {CHAT} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    ).encode()


def test_a_chunked_body_past_the_limit_is_a_413(stack: Stack) -> None:
    piece = b" " * 16384
    pieces = [b"%x\r\n%s\r\n" % (len(piece), piece)] * (MAX_BODY // len(piece) + 4)
    with nothing_secret_logged(stack):
        status, body = raw_http(
            stack, head(stack, "Transfer-Encoding: chunked\r\n"), [*pieces, b"0\r\n\r\n"]
        )
    error = error_of(body)
    assert status == 413 and error["code"] == "request_too_large"
    assert error["message"] == f"request body exceeds the limit of {MAX_BODY} bytes"


def test_a_declared_length_past_the_limit_is_a_413_before_any_body_is_sent(stack: Stack) -> None:
    status, body = raw_http(stack, head(stack, "Content-Length: 1000000000\r\n"), [])
    error = error_of(body)
    assert status == 413 and error["code"] == "request_too_large"
    assert error["message"] == f"request body of 1000000000 bytes exceeds the limit of {MAX_BODY}"


@pytest.mark.parametrize("model", [MODEL, PROVIDER_MODEL])
@pytest.mark.parametrize("depth", [300, 1000])
def test_nesting_the_gateway_cannot_forward_is_a_400(stack: Stack, depth: int, model: str) -> None:
    """orjson reads 1024 levels but writes 254 (and litellm's json about 1000): deeper
    passthrough fields cannot go on, whichever the upstream."""
    body = chat(model=model)[:-1] + b', "extra": ' + b"[" * depth + b"]" * depth + b"}"
    with nothing_secret_logged(stack):
        status, reply = post(stack, body)
    error = error_of(reply)
    assert status == 400 and error["type"] == "invalid_request_error", error
    assert error["message"] == (
        "request body is nested more than 254 levels deep: cannot forward it"
    )


@pytest.mark.parametrize("model", [MODEL, PROVIDER_MODEL])
def test_nesting_the_gateway_can_forward_is_served(stack: Stack, model: str) -> None:
    body = chat(model=model)[:-1] + b', "extra": ' + b"[" * 200 + b"]" * 200 + b"}"
    status, reply = post(stack, body)
    assert status == 200, reply
    assert json.loads(reply)["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize(
    "body",
    [
        chat().replace(b'"hello"', b'"\xff"'),
        chat().replace(b'"hello"', b'"\\ud800"'),
        b'{"model": "\xc3\x28", "messages": []}',
        b'{"model": "\xc0\xaf", "messages": []}',
        b"\xef\xbb\xbf" + chat(),  # a byte-order mark is not JSON
        b"\x00" * 64,
    ],
    ids=["invalid-byte", "lone-surrogate", "invalid-sequence", "overlong", "bom", "nul-bytes"],
)
def test_invalid_utf8_is_a_400(stack: Stack, body: bytes) -> None:
    with nothing_secret_logged(stack):
        status, reply = post(stack, body)
    error = error_of(reply)
    assert status == 400 and error["param"] is None
    assert str(error["message"]).startswith("request body is not valid JSON: ")


def test_invalid_utf8_in_a_statement_query_is_a_400(stack: Stack) -> None:
    status, _, reply = call(
        stack.url + "/v1/billing/statement?start=%FF%FE&end=2026-01-01", headers=auth(stack)
    )
    assert status == 400 and error_of(reply)["param"] == "start"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n"])
@pytest.mark.parametrize(
    "value",
    [10**30, 2**64, 2**63, -1, 1_000_001, 1.5, 1e308, True, "1", [1], {"a": 1}],
    ids=repr,
)
def test_absurd_token_limits_are_a_400_naming_the_field(
    stack: Stack, field: str, value: Any
) -> None:
    status, reply = post(stack, chat(**{field: value}))
    error = error_of(reply)
    assert status == 400 and error["param"] == field
    assert error["type"] == "invalid_request_error"


def test_a_limit_past_the_models_context_is_the_replicas_400_in_our_shape(stack: Stack) -> None:
    status, reply = post(stack, chat(max_tokens=1_000_000))
    assert status == 400
    assert error_of(reply) == {
        "message": "'max_tokens' or 'max_completion_tokens' is too large: 1000000. This "
        "model's maximum context length is 4096 tokens and your request has 3 input tokens "
        "(1000000 > 4096 - 3).",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_unknown_fields_pass_through_and_are_served(stack: Stack) -> None:
    """vLLM and the providers take many extensions: the gateway forwards what it does not
    know, whatever its shape, and serves the request."""
    body = chat(
        temperature=0.5,
        x_vendor={"nested": [1, {"deep": ["ünïcödé", None, 1e-300]}]},
        **{"": "empty name", "\u202e": "bidi override"},
    )
    status, reply = post(stack, body)
    assert status == 200, reply
    assert json.loads(reply)["usage"]["completion_tokens"] == 2
    status, _, reply = call(
        stack.url + "/v1/billing/statement?start=2026-01-01&end=2026-01-01&surprise=1",
        headers=auth(stack),
    )
    assert status == 200 and json.loads(reply)["totals"]["requests"] == 0


@pytest.mark.parametrize("value", ["a\u0000b", "line\nbreak", "\u0007bell", "tab\there"])
def test_control_characters_in_an_interaction_id_are_a_400(stack: Stack, value: str) -> None:
    """Ids are stored and shown: no control characters (Postgres refuses NUL outright)."""
    with nothing_secret_logged(stack):
        status, reply = post(stack, chat(metadata={"interaction_id": value}))
    assert status == 400 and error_of(reply)["param"] == "metadata.interaction_id"
    # Nothing was left behind that blocks the records after it.
    status, _ = post(stack, chat(), **{"X-Interaction-Id": "after-the-control-characters"})
    assert status == 200
    wait_recorded(stack.url)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("start=9999-12-31&end=9999-12-31", "end"),
        ("start=0001-01-01&end=0001-01-01", None),
        ("start=2025-01-01&end=2026-01-01", None),  # 366 days: the longest period
        ("start=2025-01-01&end=2026-01-02", "end"),
        ("start=2026-02-30&end=2026-03-01", "start"),
        ("start=20260101&end=2026-01-01", "start"),
    ],
)
def test_statement_periods_at_the_calendars_ends(
    stack: Stack, query: str, param: str | None
) -> None:
    status, _, reply = call(stack.url + f"/v1/billing/statement?{query}", headers=auth(stack))
    if param is None:
        assert status == 200 and json.loads(reply)["totals"]["requests"] == 0
    else:
        assert status == 400 and error_of(reply)["param"] == param, reply


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", CHAT, "POST"),
        ("DELETE", "/v1/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("PUT", "/v1/billing/statement", "GET"),
        ("DELETE", "/v1/admin/statement", "GET"),
        ("POST", "/healthz", "GET"),
    ],
)
def test_a_wrong_method_is_a_405_that_says_which_are_allowed(
    stack: Stack, method: str, path: str, allowed: str
) -> None:
    status, headers, body = call(stack.url + path, b"{}", auth(stack), method=method)
    assert status == 405 and error_of(body)["type"] == "invalid_request_error"
    assert headers.get("allow") == allowed
