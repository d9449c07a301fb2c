"""schemathesis against the gateway's own OpenAPI document, every operation, both ways.

Requests generated from the schema (valid ones, and ones that break it) go to a real
`kvgate serve` with a real `kvgate sim` behind it. Whatever is sent: no 5xx; every status,
content type and body is one the schema documents; every error is exactly OpenAI's shape;
no answer shows a key or the server secret. Deterministic (derandomized, no example
database), and small enough to run on every commit.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.serving.calls import Endpoint
from tests.reliability.conftest import ADMIN_TOKEN, Stack, anthropic_error_of, call, error_of

pytestmark = pytest.mark.e2e

OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model}"),
    ("GET", "/v1/billing/statement"),
    ("GET", "/v1/billing/breakers"),
    ("GET", "/v1/admin/statement"),
    ("POST", "/v1/admin/keys"),
    ("GET", "/v1/admin/keys"),
    ("DELETE", "/v1/admin/keys/{key_id}"),
    ("GET", "/v1/billing/budgets"),
    ("POST", "/v1/admin/budgets"),
    ("GET", "/v1/admin/budgets"),
    ("DELETE", "/v1/admin/budgets/{budget_id}"),
    ("POST", "/v1/admin/limits"),
    ("GET", "/v1/admin/limits"),
    ("DELETE", "/v1/admin/limits/{limit_id}"),
    ("GET", "/healthz"),
]
# Operations whose generated (random) tenant names or key ids never exist: 404s, not 200s.
NAMED = {
    ("GET", "/v1/models/{model}"),
    ("GET", "/v1/admin/statement"),
    ("POST", "/v1/admin/keys"),
    ("DELETE", "/v1/admin/keys/{key_id}"),
    ("POST", "/v1/admin/budgets"),
    ("DELETE", "/v1/admin/budgets/{budget_id}"),
    ("POST", "/v1/admin/limits"),
    ("DELETE", "/v1/admin/limits/{limit_id}"),
}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = 30


def test_the_schema_documents_every_endpoint(stack: Stack) -> None:
    status, _, body = call(stack.url + "/openapi.json")
    document = json.loads(body)
    assert status == 200
    documented = [(m.upper(), p) for p, item in document["paths"].items() for m in item]
    assert sorted(documented) == sorted(OPERATIONS)
    error = document["components"]["schemas"]["ErrorDetail"]
    assert error["required"] == ["message", "type", "param", "code"]
    # Once started, the gateway names the models it serves.
    chat = document["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["properties"]["model"]["enum"] == ["claude", "kvgate/demo-llama-8b"]
    text = document["components"]["schemas"]["CompletionRequest"]
    assert text["properties"]["model"]["enum"] == ["kvgate/demo-llama-8b"]  # hosted: no completions
    # And /v1/models says so, model by model.
    auth = {"Authorization": f"Bearer {stack.keys['alpha']}"}
    for model, endpoints in (
        (
            "claude",
            [
                "/v1/chat/completions",
                "/v1/responses",
                "/v1/messages",
                "/v1/messages/count_tokens",
            ],
        ),
        ("kvgate/demo-llama-8b", [e.value for e in Endpoint]),
    ):
        status, _, body = call(f"{stack.url}/v1/models/{model}", headers=auth)
        assert status == 200 and json.loads(body)["endpoints"] == endpoints


def test_every_operation_documented_as_secured_refuses_a_request_without_a_key(
    stack: Stack,
) -> None:
    document = json.loads(call(stack.url + "/openapi.json")[2])
    secured = [
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if operation.get("security")
    ]
    assert sorted(secured) == sorted(op for op in OPERATIONS if op[1] != "/healthz")
    for method, path in secured:
        url = stack.url + path.replace("{key_id}", "key_0")
        status, headers, body = call(url, b"{}" if method == "POST" else None, method=method)
        read = anthropic_error_of if path.startswith("/v1/messages") else error_of
        assert status == 401 and read(body)["type"] == "authentication_error", path
        assert headers["www-authenticate"] == "Bearer"


# Negative cases need an input to break: /v1/models and /healthz take none.
CASES = [
    pytest.param(method, path, mode, id=f"{path}-{mode.value}")
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or path not in ("/v1/models", "/healthz")
]


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_generated_requests_get_documented_answers_and_never_a_5xx(
    stack: Stack, method: str, path: str, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(stack.url + "/openapi.json")
    operation = schema[path][method]
    key = ADMIN_TOKEN if path.startswith("/v1/admin/") else stack.keys["alpha"]
    hidden = list(stack.secrets().values())
    seen: list[int] = []
    cases = operation.as_strategy(mode)
    if mode is GenerationMode.POSITIVE:
        # The schema's own examples too: requests that go all the way to the replica.
        examples = st.one_of(*schema.get_strategies_from_examples(operation))
        cases = st.one_of(cases, examples)

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def check(case: schemathesis.Case) -> None:
        reply = case.call_and_validate(headers={"Authorization": f"Bearer {key}"}, checks=CHECKS)
        if reply.status_code >= 400:
            (anthropic_error_of if path.startswith("/v1/messages") else error_of)(reply.content)
        assert not [s for s in hidden if s.encode() in reply.content]
        seen.append(reply.status_code)

    check()
    # Valid requests get through (the admin's, for random tenant names, are 404s).
    if mode is GenerationMode.POSITIVE and (method, path) not in NAMED:
        assert 200 in seen, seen
