"""A gateway restarted while its database is down starts, serves the keys it knew from its
local snapshot, journals every record, and refuses keys it never saw with a 503 that says
why (never a 401). When the database is back, every record arrives, exactly once, priced.

Postgres: a private server, stopped (`pg_ctl stop -m fast`) and started again. SQLite: the
database file's directory moved away (`sqlite3` cannot open a file whose directory is
gone) and back. Before, the gateway refused to start at all: loading keys failed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import openai
import pytest
from openai import OpenAI
from sqlalchemy import select

from gateway.db.models import RequestRow
from tests.faults.conftest import MODEL, Stack, make_stack
from tests.faults.postgres import PrivatePostgres
from tests.faults.probes import healthz
from tests.support.processes import Proc, free_port, wait_http, wait_recorded

pytestmark = pytest.mark.e2e
BEFORE, DURING = 10, 60  # requests with the database up, then with it down


@dataclass
class Outage:
    """A database that can be taken away and brought back."""

    url: str
    down: Callable[[], None]
    up: Callable[[], None]


@pytest.fixture(params=["sqlite", "postgres"])
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Outage]:
    if request.param == "postgres":
        server = PrivatePostgres()
        server.start()
        try:
            yield Outage(server.url, server.stop, server.start)
        finally:
            server.destroy()
        return
    home, away = tmp_path / "db", tmp_path / "db-away"
    home.mkdir()
    yield Outage(
        f"sqlite:///{home / 'kvgate.db'}", lambda: home.rename(away), lambda: away.rename(home)
    )


def start_without_database(stack: Stack) -> tuple[Proc, float]:
    """`kvgate serve` as the stack starts it, but ready when it answers: its database
    writer cannot start writing (the usual helper waits for that)."""
    port = free_port()
    log = stack.tmp / f"gateway-{port}.log"
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(stack.config),
         "--port", str(port)],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, env=stack.env, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/healthz", timeout_s=60, process=process)
    except BaseException:
        print(log.read_text(errors="replace"))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        raise
    return Proc(process, url, log), time.monotonic() - started


def ask(url: str, key: str, n: int) -> tuple[str, Decimal]:
    """One request (every other one streamed): its id and the cost the client was told."""
    with OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as client:
        messages = [{"role": "user", "content": f"request {n} " * 20}]
        if n % 2:
            reply = client.chat.completions.with_raw_response.create(
                model=MODEL,
                max_tokens=4,
                messages=messages,  # type: ignore[arg-type]
            )
            cost = reply.parse().usage.model_extra["cost"]  # type: ignore[union-attr]
            return reply.headers["x-request-id"], Decimal(cost)
        stream = client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=4, messages=messages, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream.parse())
        cost = chunks[-1].usage.model_extra["cost"]  # type: ignore[union-attr]
        return stream.headers["x-request-id"], Decimal(cost)


def unknown_key(url: str) -> openai.APIStatusError:
    """What a key the gateway never saw gets."""
    key = "kvg-" + secrets.token_urlsafe(32)
    with OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as client:
        try:
            client.models.list()
        except openai.APIStatusError as error:
            return error
    raise AssertionError("an unknown key was accepted")


def test_a_gateway_restarted_during_an_outage_serves_known_keys_and_loses_no_record(
    outage: Outage, tmp_path: Path
) -> None:
    stack = make_stack(tmp_path, outage.url)
    try:
        snapshot = tmp_path / "journal" / "snapshot"
        deadline = time.monotonic() + 10
        while not ((snapshot / "keys.json").exists() and (snapshot / "prices.json").exists()):
            assert time.monotonic() < deadline, "no snapshot written"
            time.sleep(0.05)
        told = dict(ask(stack.url, stack.key, n) for n in range(BEFORE))
        wait_recorded(stack.url)
        assert stack.gateway is not None
        stack.gateway.stop()

        outage.down()
        gateway, start_s = start_without_database(stack)
        stack.gateway = gateway
        assert healthz(gateway.url)["directory"] == "snapshot"
        served_from = time.monotonic()
        during = dict(ask(gateway.url, stack.key, BEFORE + n) for n in range(DURING))
        serve_s = time.monotonic() - served_from
        unknown = unknown_key(gateway.url)
        assert unknown.status_code == 503
        assert isinstance(unknown.body, dict) and unknown.body["code"] == "keys_unavailable"
        assert unknown.body["type"] == "service_unavailable"
        assert "until the database is reachable again" in unknown.body["message"]
        health = healthz(gateway.url)
        assert (health["recorder_backlog"], health["database_reachable"]) == (DURING, False)

        outage.up()
        up_at = time.monotonic()
        drained_s = reloaded_s = None
        while drained_s is None or reloaded_s is None:
            assert time.monotonic() - up_at < 60, "records not drained or directory not reloaded"
            health = healthz(gateway.url)
            if drained_s is None and health["recorder_backlog"] == 0:
                drained_s = time.monotonic() - up_at
            if reloaded_s is None and health["directory"] == "database":
                reloaded_s = time.monotonic() - up_at
            time.sleep(0.05)
        assert unknown_key(gateway.url).status_code == 401  # the database says no: a 401 again

        told.update(during)
        with stack.engine.connect() as connection:
            rows = connection.execute(
                select(RequestRow.request_id, RequestRow.cost_total, RequestRow.price_id)
            ).all()
        assert sorted(r.request_id for r in rows) == sorted(told)  # each one, exactly once
        assert all(r.price_id == f"{MODEL}@2026-07-01T00:00:00Z" for r in rows)
        assert {r.request_id: r.cost_total for r in rows} == told  # priced as the client saw
        assert all(cost > 0 for cost in told.values())
        print(
            f"\n{outage.url.split(':')[0]}: started without its database in {start_s:.1f} s; "
            f"served {DURING} requests from the snapshot in {serve_s:.1f} s, every one a 200; "
            f"unknown key: 503 keys_unavailable; database back: {DURING} records drained in "
            f"{drained_s:.1f} s, keys and prices reloaded in {reloaded_s:.1f} s; "
            f"{len(rows)} records for {len(told)} requests"
        )
    finally:
        stack.close()
