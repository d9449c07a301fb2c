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
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway.db import crud
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from pricing.book import load_catalog
from tests.conftest import _backends, new_database
from tests.support.processes import (
    Proc,
    free_port,
    gateway_env,
    start_gateway,
    start_sim,
    wait_http,
    wait_recorded,
    write_config,
)

MODEL = "kvgate/demo-llama-8b"
PROVIDER_MODEL = "claude"  # through litellm, to the provider emulator of tests/providers
PROVIDER_KEY_ENV = "KVGATE_TEST_ANTHROPIC_KEY"
PROVIDER_KEY = "sk-ant-provider-key-0c4d8e2a91b7"
SECRET = "server-secret-8f3c1a9e77d04b52"
ADMIN_TOKEN = "admin-token-5be1d0c6a2f94e18"
MAX_BODY = 65536


@dataclass
class Stack:
    url: str
    database_url: str
    engine: Engine
    env: dict[str, str]
    keys: dict[str, str]
    key_ids: dict[str, str]
    tenant_ids: dict[str, str]
    gateway: Proc
    sim: Proc
    emulator: Proc
    tmp: Path

    def secrets(self) -> dict[str, str]:
        """Everything that must never be shown: the server secret, admin token, tenant keys."""
        return {
            "secret": SECRET,
            "admin token": ADMIN_TOKEN,
            "provider key": PROVIDER_KEY,
            **self.keys,
        }

    def log_size(self) -> int:
        return self.gateway.log.stat().st_size

    def log_since(self, offset: int) -> str:
        with self.gateway.log.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def tenant(self, name: str) -> str:
        """A new tenant with one key; its key."""
        with transaction(session_factory(self.engine)) as session:
            self.tenant_ids[name] = crud.create_tenant(session, name=name).id
            issued = crud.create_key(session, tenant_name=name)
        self.key_ids[name], self.keys[name] = issued.id, issued.key
        return issued.key


def call(
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request; (status, headers, body) whatever the status."""
    request = urllib.request.Request(
        url, data=body, headers=headers or {}, method=method or ("POST" if body else "GET")
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def start_emulator(tmp: Path) -> Proc:
    """tests/providers' emulator of hosted providers, in its own process."""
    port = free_port()
    log = tmp / "emulator.log"
    command = [sys.executable, "-m", "tests.providers.emulator", "--port", str(port)]
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", process=process)
    return Proc(process, url, log)


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


@pytest.fixture(scope="session", params=_backends())
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("reliability")
    with new_database(request.param, tmp) as database_url:
        env = gateway_env(
            database_url,
            tmp / "journal",
            KVGATE_SECRET=SECRET,
            KVGATE_ADMIN_TOKEN=ADMIN_TOKEN,
            KVGATE_MAX_BODY_BYTES=str(MAX_BODY),
            KVGATE_LOG_LEVEL="debug",
            **{PROVIDER_KEY_ENV: PROVIDER_KEY},
        )
        upgrade(database_url)
        engine = make_engine(database_url)
        with transaction(session_factory(engine)) as session:
            crud.add_prices(session, prices=load_catalog())
        sim = start_sim(
            tmp,
            extra=(
                "--prefill-tokens-per-s=0",
                "--decode-tokens-per-s=0",
                "--max-model-len=4096",
            ),
        )
        emulator = start_emulator(tmp)
        provider = {
            "name": PROVIDER_MODEL,
            "backend": "litellm",
            "litellm_model": "anthropic/anthropic-cache-write",
            "api_base": emulator.url,
            "api_key_env": PROVIDER_KEY_ENV,
            "price_model": MODEL,
        }
        config = write_config(
            tmp / "kvgate.yaml", [{"name": MODEL, "replicas": [sim.url]}, provider]
        )
        gateway = start_gateway(tmp, config, env)
        stack = Stack(
            gateway.url, database_url, engine, env, {}, {}, {}, gateway, sim, emulator, tmp
        )
        try:
            for name in ("alpha", "beta"):
                stack.tenant(name)
            yield stack
        finally:
            gateway.stop()
            sim.stop()
            emulator.stop()
            engine.dispose()
