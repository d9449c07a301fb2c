"""Tenants see only their own data; admin needs the admin token; secrets are never shown.

tests/e2e/test_gateway.py already shows that tenant B gets no cache hit on tenant A's
prompt, that a client salt both send does not cross, and that the admin statement refuses
a tenant key. These go further: B holding A's exact upstream salt, every endpoint that
returns data, interaction ids shared by name, every credential the admin endpoint could be
offered, how keys are compared, and where secrets could surface (answers, logs, startup
errors, the dashboard).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import select

from gateway.accounting.recorder import insert_records
from gateway.auth import cache_salt, hash_key
from gateway.db import crud
from gateway.db.models import ApiKeyRow, Base, InteractionRow, RequestRow
from gateway.db.session import make_engine, session_factory, transaction
from tests.dashboard.conftest import open_app, world_records
from tests.factories import JAN, JUL, prepared_database
from tests.reliability.conftest import (
    ADMIN_TOKEN,
    MODEL,
    SECRET,
    Stack,
    call,
    error_of,
    nothing_secret_logged,
)
from tests.support.processes import wait_recorded

pytestmark = pytest.mark.e2e

TODAY = datetime.now(UTC).date()
PROMPT = "A prompt long enough to fill several KV blocks of sixteen tokens each, " * 4


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "content-type": "application/json"}


def complete(
    stack: Stack, key: str, path: str = "/v1/chat/completions", **extra: Any
) -> dict[str, Any]:
    headers = bearer(key) | extra.pop("headers", {})
    if path == "/v1/completions":
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, **extra}
    else:
        messages = [{"role": "user", "content": PROMPT}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 2, **extra}
    status, reply_headers, reply = call(stack.url + path, orjson.dumps(body), headers)
    assert status == 200, reply
    return {"request_id": reply_headers["x-request-id"], **json.loads(reply)}


def cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


def statement(stack: Stack, key: str, query: str = "") -> dict[str, Any]:
    status, _, body = call(
        stack.url + f"/v1/billing/statement?start={TODAY}&end={TODAY}{query}", headers=bearer(key)
    )
    assert status == 200, body
    return dict(json.loads(body))


def test_a_statement_shows_its_own_tenant_only_whatever_the_query_says(stack: Stack) -> None:
    a, b = stack.tenant("stmt-a"), stack.tenant("stmt-b")
    for _ in range(2):
        complete(stack, a)
    for _ in range(3):
        complete(stack, b)
    wait_recorded(stack.url)
    b_id = stack.tenant_ids["stmt-b"]
    for query in ("", f"&tenant=stmt-b&tenant_id={b_id}&tenant.id={b_id}"):
        mine = statement(stack, a, query)
        assert mine["tenant"] == {"id": stack.tenant_ids["stmt-a"], "name": "stmt-a"}
        assert mine["totals"]["requests"] == 2
        assert "stmt-b" not in json.dumps(mine) and b_id not in json.dumps(mine)
    assert statement(stack, b)["totals"]["requests"] == 3


def test_one_interaction_id_in_two_tenants_is_two_interactions(stack: Stack) -> None:
    a, b = stack.tenant("conv-a"), stack.tenant("conv-b")
    shared = {"X-Interaction-Id": "conversation-everyone-uses"}
    complete(stack, a, headers=shared)
    for _ in range(3):
        complete(stack, b, headers=shared)
    complete(stack, b, metadata={"interaction_id": "conversation-everyone-uses"})
    wait_recorded(stack.url)
    for key, requests in ((a, 1), (b, 4)):
        totals = statement(stack, key)["totals"]
        assert (totals["requests"], totals["completed_interactions"]) == (requests, 1)
    with stack.engine.connect() as connection:
        rows = connection.execute(
            select(InteractionRow.tenant_id, InteractionRow.cells).where(
                InteractionRow.interaction_id == "conversation-everyone-uses"
            )
        ).all()
    assert sorted(rows) == sorted(
        [(stack.tenant_ids["conv-a"], 1), (stack.tenant_ids["conv-b"], 1)]
    )


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_tenant_holding_another_tenants_exact_salt_still_gets_no_hit(
    stack: Stack, path: str
) -> None:
    """Even A's real upstream salt, sent by B as its cache_salt, is folded under B's."""
    name = "salt-a" + path.replace("/", "-")
    a, b = stack.tenant(name), stack.tenant("salt-b" + path.replace("/", "-"))
    a_salt = cache_salt(SECRET, f"tenant:{stack.tenant_ids[name]}")
    complete(stack, a, path)
    assert cached(complete(stack, a, path)) > 0
    for extra in ({"cache_salt": a_salt}, {}):
        other = complete(stack, b, path, **extra)
        assert cached(other) == 0, extra
    wait_recorded(stack.url)
    with stack.engine.connect() as connection:
        predicted = connection.scalar(
            select(RequestRow.predicted_cached_tokens).where(
                RequestRow.request_id == other["request_id"]
            )
        )
    assert predicted == 0  # the router did not expect A's blocks for B either


def test_public_endpoints_name_no_tenant_and_no_key(stack: Stack) -> None:
    stack.tenant("public-a")
    complete(stack, stack.keys["public-a"])
    wait_recorded(stack.url)
    hidden = [*stack.keys, *stack.key_ids.values(), *stack.secrets().values()]
    hidden += list(stack.tenant_ids.values())
    for path, key in (("/metrics", None), ("/healthz", None), ("/v1/models", "public-a")):
        headers = bearer(stack.keys[key]) if key else {}
        status, _, body = call(stack.url + path, headers=headers)
        text = body.decode()
        assert status == 200
        assert [h for h in hidden if h in text] == [], path


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        f"Bearer {ADMIN_TOKEN.upper()}",
        f"Bearer {ADMIN_TOKEN}x",
        f"Bearer {ADMIN_TOKEN[:-1]}",
        f"Token {ADMIN_TOKEN}",
        f"Bearer {SECRET}",
        "tenant key",
    ],
    ids=["none", "empty", "no-token", "case", "longer", "shorter", "scheme", "secret", "tenant"],
)
def test_the_admin_endpoint_takes_the_admin_token_and_nothing_else(
    stack: Stack, authorization: str | None
) -> None:
    if authorization == "tenant key":
        authorization = f"Bearer {stack.keys['alpha']}"
    headers = {} if authorization is None else {"Authorization": authorization}
    query = f"/v1/admin/statement?tenant=alpha&start={TODAY}&end={TODAY}"
    status, _, body = call(stack.url + query, headers=headers)
    error = error_of(body)
    assert status == 401 and error["code"] == "invalid_admin_token"
    assert ADMIN_TOKEN not in body.decode()
    status, _, body = call(stack.url + query, headers=bearer(ADMIN_TOKEN))
    assert status == 200 and json.loads(body)["tenant"]["name"] == "alpha"


@pytest.mark.parametrize(
    "path", ["/v1/models", "/v1/billing/statement?start=2026-01-01&end=2026-01-01"]
)
def test_the_admin_token_is_not_a_tenant_key(stack: Stack, path: str) -> None:
    status, _, body = call(stack.url + path, headers=bearer(ADMIN_TOKEN))
    assert status == 401 and error_of(body)["type"] == "authentication_error"


def test_no_answer_or_log_line_shows_a_key_or_the_secret(stack: Stack) -> None:
    """Keys offered the wrong way, revoked, at the wrong endpoint; the secret as a salt."""
    key = stack.tenant("careless")
    attempts = [
        ("/v1/models", {"Authorization": f"Token {key}"}),
        ("/v1/models", {"Authorization": f"Bearer {key}junk"}),
        ("/v1/models", {"Authorization": key}),
        ("/v1/models", {"Authorization": f"Bearer {SECRET}"}),
        ("/v1/admin/statement?tenant=careless&start=2026-01-01&end=2026-01-01", bearer(key)),
    ]
    with nothing_secret_logged(stack):
        for path, headers in attempts:
            status, _, body = call(stack.url + path, headers=headers)
            assert status == 401
            assert [s for s in (key, SECRET, ADMIN_TOKEN) if s in body.decode()] == []
        salted = complete(stack, key, cache_salt=SECRET)
        assert SECRET not in json.dumps(salted)
        with transaction(session_factory(stack.engine)) as session:
            crud.revoke_key(session, key_id=stack.key_ids["careless"])
        deadline = time.monotonic() + 5
        status = 200
        while status == 200 and time.monotonic() < deadline:
            status, _, body = call(stack.url + "/v1/models", headers=bearer(key))
        assert status == 401 and key not in body.decode()


def test_a_startup_failure_shows_no_secret(tmp_path: Any) -> None:
    """A production gateway with a weak secret refuses to start, quoting no setting."""
    env = {
        "PATH": "/usr/bin:/bin",
        "KVGATE_ENVIRONMENT": "production",
        "KVGATE_SECRET": "short",
        "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "KVGATE_DATABASE_URL": "postgresql://kvgate:db-password-31f7@127.0.0.1:1/kvgate",
        "KVGATE_DASHBOARD_PASSWORD": "dashboard-password-9c2e",
    }
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output  # a message, not a crash
    assert "KVGATE_SECRET must be set to a real secret in production" in output
    assert [
        s for s in (ADMIN_TOKEN, "db-password-31f7", "dashboard-password-9c2e") if s in output
    ] == []


def element_bytes(node: Any) -> Iterator[bytes]:
    """Every element of a rendered page, serialized (tables and charts included)."""
    proto = getattr(node, "proto", None)
    if proto is not None:
        yield proto.SerializeToString()
    for child in getattr(node, "children", {}).values():
        yield from element_bytes(child)


def test_the_dashboard_shows_no_key_hash_or_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every page, with tenants, keys and requests: not a key, a key's hash or a secret.

    SQLite only: what a page shows does not depend on the backend (tests/dashboard
    renders every page on both)."""
    url = f"sqlite:///{tmp_path / 'kvgate.db'}"
    made = prepared_database(url, "shown-a", "shown-b", prices=[JAN, JUL])
    engine = make_engine(url)
    insert_records(engine, world_records(made["shown-a"].id, made["shown-b"].id))
    engine.dispose()
    monkeypatch.setenv("KVGATE_SECRET", SECRET)
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", ADMIN_TOKEN)
    keys = [tenant.key for tenant in made.values()]
    hidden = [SECRET, ADMIN_TOKEN, *keys, *(hash_key(key) for key in keys)]
    # What each page shows of this world in its main area (the sidebar names the tenants
    # on every page), so that a page that failed to show its data cannot pass.
    data = {
        None: b"USD 0.150974155",  # the spend of both tenants
        "requests": b"req_7",
        "routing": b"http://r2",
        "tenants": b"0.000974155",  # shown-a's spend
        "models": b"1 attempts in this period had no price entry",
    }
    for page, marker in data.items():
        app = open_app(url, monkeypatch, page=page)
        main, sidebar = (b"".join(element_bytes(root)) for root in (app.main, app.sidebar))
        assert marker in main, page
        assert [h for h in hidden if h.encode() in main + sidebar] == [], page


def test_nothing_stored_holds_a_key_or_the_secret(stack: Stack) -> None:
    """After traffic from every tenant: not in the journal, not in any table (keys are
    stored as SHA-256 digests only)."""
    for name, key in stack.keys.items():  # revoked ones too: they are refused
        body = {"model": MODEL, "prompt": "stored?", "max_tokens": 1, "cache_salt": name}
        call(stack.url + "/v1/completions", orjson.dumps(body), bearer(key))
    wait_recorded(stack.url)
    hidden = list(stack.secrets().items())
    journal = b"".join(p.read_bytes() for p in (stack.tmp / "journal").rglob("*") if p.is_file())
    assert [name for name, s in hidden if s.encode() in journal] == []
    with stack.engine.connect() as connection:
        for table in Base.metadata.sorted_tables:
            text = repr(connection.execute(select(table)).all())
            assert [name for name, s in hidden if s in text] == [], table.name
        digests = set(connection.scalars(select(ApiKeyRow.key_hash)))
    assert {hash_key(key) for key in stack.keys.values()} <= digests
