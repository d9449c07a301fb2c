"""Key administration over the API: POST/GET /v1/admin/keys, DELETE /v1/admin/keys/{id},
with the admin token, errors in the OpenAI shape, the key shown once and never again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from gateway.auth import hash_key
from tests.e2e.conftest import ADMIN_TOKEN
from tests.reliability.conftest import error_of
from tests.support.processes import call
from tests.support.stack import Stack

pytestmark = pytest.mark.e2e


def admin(
    stack: Stack, method: str, path: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token or ADMIN_TOKEN}"}
    raw = None
    if body is not None:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        headers["Content-Type"] = "application/json"
    status, _, answer = call(stack.url + path, raw, headers, method=method)
    return status, orjson.loads(answer)


def models_status(stack: Stack, key: str) -> int:
    return call(stack.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})[0]


def test_a_key_is_issued_listed_and_revoked_and_never_shown_again(stack: Stack) -> None:
    stack.tenant("keyed")
    before = datetime.now(UTC) - timedelta(seconds=1)
    status, issued = admin(stack, "POST", "/v1/admin/keys", {"tenant": "keyed"})
    assert status == 201 and sorted(issued) == ["created", "id", "key", "tenant"]
    assert issued["tenant"] == "keyed" and issued["id"].startswith("key_")
    assert issued["key"].startswith("kvg-") and len(issued["key"]) > 40
    assert datetime.fromisoformat(issued["created"]) >= before
    assert models_status(stack, issued["key"]) == 200  # works at once

    status, listed = admin(stack, "GET", "/v1/admin/keys?tenant=keyed")
    assert status == 200 and listed["object"] == "list"
    assert [sorted(k) for k in listed["data"]] == [["created", "id", "revoked", "tenant"]] * 2
    mine = next(k for k in listed["data"] if k["id"] == issued["id"])
    assert mine == {
        "id": issued["id"],
        "tenant": "keyed",
        "created": issued["created"],
        "revoked": None,
    }
    _, everyone = admin(stack, "GET", "/v1/admin/keys")
    assert {k["tenant"] for k in everyone["data"]} >= {"alpha", "beta", "keyed"}
    for answer in (listed, everyone):
        text = orjson.dumps(answer).decode()
        assert issued["key"] not in text and hash_key(issued["key"]) not in text
        assert issued["key"][:10] not in text  # not even the stored prefix

    status, revoked = admin(stack, "DELETE", f"/v1/admin/keys/{issued['id']}")
    assert status == 200 and revoked["id"] == issued["id"] and revoked["revoked"] is not None
    assert models_status(stack, issued["key"]) == 401  # refused at once
    status, again = admin(stack, "DELETE", f"/v1/admin/keys/{issued['id']}")
    assert status == 200 and again == revoked  # revoking twice changes nothing
    _, listed = admin(stack, "GET", "/v1/admin/keys?tenant=keyed")
    assert next(k for k in listed["data"] if k["id"] == issued["id"]) == revoked


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        ("POST", "/v1/admin/keys", {"tenant": "nobody-here"}, 404, None),
        ("GET", "/v1/admin/keys?tenant=nobody-here", None, 404, None),
        ("DELETE", "/v1/admin/keys/key_nope", None, 404, None),
        ("POST", "/v1/admin/keys", {}, 400, "tenant"),
        ("POST", "/v1/admin/keys", {"tenant": ""}, 400, "tenant"),
        ("POST", "/v1/admin/keys", {"tenant": 7}, 400, "tenant"),
        ("POST", "/v1/admin/keys", {"tenant": "alpha", "admin": True}, 400, "admin"),
        ("POST", "/v1/admin/keys", b"{not json", 400, None),
        ("POST", "/v1/admin/keys", [], 400, None),
    ],
)
def test_bad_calls_get_a_4xx_in_the_openai_shape(
    stack: Stack, method: str, path: str, body: Any, status: int, param: str | None
) -> None:
    got, answer = admin(stack, method, path, body)
    assert got == status, answer
    error = error_of(orjson.dumps(answer))
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/admin/keys", {"tenant": "alpha"}),
        ("GET", "/v1/admin/keys", None),
        ("DELETE", "/v1/admin/keys/key_nope", None),
    ],
)
def test_only_the_admin_token_administers_keys(
    stack: Stack, method: str, path: str, body: Any
) -> None:
    for token in (stack.keys["alpha"], ADMIN_TOKEN + "x", "nothing"):
        status, answer = admin(stack, method, path, body, token=token)
        assert status == 401 and error_of(orjson.dumps(answer))["code"] == "invalid_admin_token"
    status, _, answer = call(stack.url + path, orjson.dumps(body) if body else None, method=method)
    assert status == 401 and error_of(answer)["type"] == "authentication_error"


def test_the_key_endpoints_are_in_the_openapi_document(stack: Stack) -> None:
    document = orjson.loads(call(stack.url + "/openapi.json")[2])
    for path, method in [
        ("/v1/admin/keys", "post"),
        ("/v1/admin/keys", "get"),
        ("/v1/admin/keys/{key_id}", "delete"),
    ]:
        operation = document["paths"][path][method]
        assert operation["security"] == [{"AdminToken": []}], (path, method)
        assert {"400", "401", "404"} <= set(operation["responses"]), (path, method)
