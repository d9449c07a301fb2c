"""One real stack for the bad-input, schema and isolation tests, per database backend.

`kvgate sim` (instant timing: these tests are about answers, not latency) behind
`kvgate serve`, logging at debug level so that every line the gateway could ever log is
there to be searched for secrets. The database is prepared in-process (migrations, the
catalog's prices, tenants and keys through gateway.db.crud): tests/e2e covers the CLI, and
these tests make many tenants.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest

from tests.conftest import _backends, new_database
from tests.factories import litellm, vllm
from tests.support.processes import call, wait_recorded
from tests.support.stack import INSTANT, Stack, running_stack

__all__ = ["Stack", "call"]  # the tests' names for the shared stack and raw HTTP

MODEL = "kvgate/demo-llama-8b"
PROVIDER_MODEL = "claude"  # through litellm, to the provider emulator of tests/providers
PROVIDER_KEY_ENV = "KVGATE_TEST_ANTHROPIC_KEY"
PROVIDER_KEY = "sk-ant-provider-key-0c4d8e2a91b7"
SECRET = "server-secret-8f3c1a9e77d04b52"
ADMIN_TOKEN = "admin-token-5be1d0c6a2f94e18"
MAX_BODY = 65536


@contextlib.contextmanager
def nothing_secret_logged(stack: Stack) -> Iterator[None]:
    """What the gateway logs meanwhile (at debug level) holds no key, token or secret."""
    offset = stack.log_size()
    yield
    wait_recorded(stack.url)
    logged = stack.log_since(offset)
    assert [name for name, s in stack.secrets().items() if s in logged] == []


def error_of(body: bytes) -> dict[str, object]:
    """The error object of an error answer, checked to be exactly OpenAI's shape."""
    document = json.loads(body)
    assert list(document) == ["error"], document
    error = document["error"]
    assert sorted(error) == ["code", "message", "param", "type"], error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["code"] is None or isinstance(error["code"], str)
    return dict(error)


def anthropic_error_of(body: bytes) -> dict[str, object]:
    """The error object of an error answer, checked to be exactly Anthropic's shape."""
    document = json.loads(body)
    assert sorted(document) == ["error", "type"] and document["type"] == "error", document
    error = document["error"]
    assert sorted(error) == ["message", "type"], error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    return dict(error)


@pytest.fixture(scope="session", params=_backends())
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("reliability")
    with (
        new_database(request.param, tmp) as database_url,
        running_stack(
            tmp,
            database_url,
            tenants=("alpha", "beta"),
            KVGATE_SECRET=SECRET,
            KVGATE_ADMIN_TOKEN=ADMIN_TOKEN,
            KVGATE_MAX_BODY_BYTES=str(MAX_BODY),
            KVGATE_LOG_LEVEL="debug",
            **{PROVIDER_KEY_ENV: PROVIDER_KEY},
        ) as stack,
    ):
        stack.hidden = {
            "secret": SECRET,
            "admin token": ADMIN_TOKEN,
            "provider key": PROVIDER_KEY,
        }
        [sim] = stack.start_sims(extra=(*INSTANT, "--max-model-len=4096"))
        emulator = stack.start_emulator()
        provider = litellm(
            PROVIDER_MODEL,
            "anthropic/anthropic-cache-write",
            api_base=emulator.url,
            api_key_env=PROVIDER_KEY_ENV,
            price_model=MODEL,
        )
        stack.configure([vllm(MODEL, [sim.url]), provider])
        stack.start_gateway()
        yield stack
