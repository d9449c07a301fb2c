"""Prices and keys change at once everywhere: a price added, a key created or revoked,
applies to every request that starts after the command or API call returned, on both
workers of `kvgate serve --workers 2` and on a second gateway process sharing the
database (SQLite and Postgres).

Before: each worker reloaded prices every KVGATE_PRICE_REFRESH_S and keys every
KVGATE_KEY_REFRESH_S on its own clock, so requests sent right after a change were priced
with the old entry (forever) and a revoked key kept working. Here those periodic reloads
are an hour apart, so only the change mechanism can pass (on the old code, with an explicit
timestamp for "now": 32 of 32 requests sent right after an add were priced wrong).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai import OpenAI
from sqlalchemy import Engine, select

from gateway.db.models import RequestRow
from gateway.db.session import make_engine
from gateway.usage import Usage
from pricing.book import price_from_mapping
from pricing.cost import compute
from tests.conftest import _backends, new_database
from tests.factories import config_file
from tests.support.processes import (
    Proc,
    cli_tenant,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
)

pytestmark = pytest.mark.e2e
MODEL = "fresh"  # bills as PRICE_MODEL, which has no price until the first round
PRICE_MODEL = "fresh-model"
ADMIN = "test-admin-token"
ROUNDS = 4
PER_GATEWAY = {"a": 8, "b": 4}  # requests right after each change: A has two workers


@dataclass
class Pair:
    """Gateway A (two workers) and gateway B (one), one database, one sim behind both."""

    env: dict[str, str]
    engine: Engine
    key: str
    a: Proc
    b: Proc
    journal_a: Path

    def gateway(self, name: str) -> Proc:
        return self.a if name == "a" else self.b

    def ask(self, name: str, key: str | None = None) -> str:
        """One request on a connection of its own (the kernel picks A's worker); its id."""
        client = OpenAI(
            base_url=self.gateway(name).url + "/v1", api_key=key or self.key, max_retries=0
        )
        with client:
            reply = client.chat.completions.with_raw_response.create(
                model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hello " * 20}]
            )
        return reply.headers["x-request-id"]

    def worker_of(self, request_id: str) -> str:
        """Which of A's workers journaled a request (its segment's pid prefix)."""
        for segment in self.journal_a.glob("*.jsonl"):
            if request_id.encode() in segment.read_bytes():
                return segment.name.split("-")[0]
        raise AssertionError(f"{request_id} not in A's journal")

    def recorded(self, ids: list[str], timeout_s: float = 60) -> dict[str, RequestRow]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self.engine.connect() as connection:
                rows = connection.execute(
                    select(RequestRow.__table__).where(RequestRow.request_id.in_(ids))
                ).all()
            if len(rows) == len(ids) or time.monotonic() > deadline:
                return {row.request_id: row for row in rows}  # type: ignore[misc]
            time.sleep(0.1)


@pytest.fixture(scope="module", params=_backends())
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("pair")
    with new_database(request.param, tmp) as database_url:
        # The periodic safety-net reloads an hour apart: only the change itself can apply.
        env = gateway_env(
            database_url,
            tmp / "journal-a",
            KVGATE_ADMIN_TOKEN=ADMIN,
            KVGATE_PRICE_REFRESH_S="3600",
            KVGATE_KEY_REFRESH_S="3600",
        )
        kvgate("db", "upgrade", env=env)
        key, _ = cli_tenant(env, "fresh")
        sim = start_sim(tmp, extra=("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "0"))
        config = config_file(
            tmp / "kvgate.yaml",
            [
                {
                    "name": MODEL,
                    "replicas": [sim.url],
                    "price_model": PRICE_MODEL,
                    "upstream_model": "kvgate/demo-llama-8b",
                }
            ],
        )
        a = start_gateway(tmp, config, env, args=("--workers", "2"))
        b = start_gateway(tmp, config, {**env, "KVGATE_JOURNAL_DIR": str(tmp / "journal-b")})
        engine = make_engine(database_url)
        try:
            yield Pair(env, engine, key, a, b, tmp / "journal-a")
        finally:
            a.stop()
            b.stop()
            sim.stop()
            engine.dispose()


def test_a_price_added_now_prices_every_request_sent_right_after_on_every_worker(
    pair: Pair,
) -> None:
    asked: dict[str, list[str]] = {}  # price id -> the requests sent right after adding it
    prices = {}
    for n in range(1, ROUNDS + 1):
        time.sleep(1.05)  # entries are dated to the second: one round, one second
        added = kvgate(
            "prices", "add", "--model", PRICE_MODEL, "--effective-from", "now",
            "--input", str(n), "--cache-read", f"0.{n}", "--output", str(2 * n),
            env=pair.env,
        )  # fmt: skip
        price_id = added.stdout.strip().removesuffix(": added")
        asked[price_id] = [pair.ask(g) for g, count in PER_GATEWAY.items() for _ in range(count)]
        moment = price_id.split("@")[1]
        prices[price_id] = price_from_mapping(
            {"model": PRICE_MODEL, "effective_from": moment, "input": n,
             "cache_read": f"0.{n}", "output": 2 * n}
        )  # fmt: skip
    ids = [i for batch in asked.values() for i in batch]
    rows = pair.recorded(ids)
    assert len(rows) == len(ids)
    for price_id, batch in asked.items():
        for request_id in batch:
            row = rows[request_id]
            usage = Usage(
                row.uncached_tokens, row.cache_read_tokens, row.cache_write_tokens,
                row.output_tokens,
            )  # fmt: skip
            assert row.price_id == price_id, (request_id, row.price_id, price_id)
            assert Decimal(row.cost_total) == compute(usage, prices[price_id]).total
            assert Decimal(row.cost_total) > 0
    # Both of A's workers served requests sent right after a change.
    workers = {pair.worker_of(i) for batch in asked.values() for i in batch[: PER_GATEWAY["a"]]}
    assert len(workers) == 2, workers


def test_a_price_dated_seconds_ahead_applies_from_its_moment_on_every_worker(pair: Pair) -> None:
    """An entry dated 4 s ahead, loaded by every process at once: the requests sent before
    its moment keep the entry in force, those sent after it take the new one (no reload:
    the periodic one is an hour away)."""
    time.sleep(1.05)
    current = kvgate(
        "prices", "add", "--model", PRICE_MODEL, "--effective-from", "now",
        "--input", "5", "--cache-read", "0.5", "--output", "10", env=pair.env,
    ).stdout.strip().removesuffix(": added")  # fmt: skip
    moment = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)
    ahead = kvgate(
        "prices", "add", "--model", PRICE_MODEL, "--effective-from", f"{moment:%Y-%m-%dT%H:%M:%SZ}",
        "--input", "7", "--cache-read", "0.7", "--output", "14", env=pair.env,
    ).stdout.strip().removesuffix(": added")  # fmt: skip
    before = [pair.ask(g) for g, count in PER_GATEWAY.items() for _ in range(count)]
    assert datetime.now(UTC) < moment, "the requests before the moment took too long"
    time.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()) + 0.05)
    after = [pair.ask(g) for g, count in PER_GATEWAY.items() for _ in range(count)]
    rows = pair.recorded(before + after)
    assert {rows[i].price_id for i in before} == {current}
    assert {rows[i].price_id for i in after} == {ahead}
    rates = price_from_mapping(
        {"model": PRICE_MODEL, "effective_from": f"{moment:%Y-%m-%dT%H:%M:%SZ}", "input": 7,
         "cache_read": "0.7", "output": 14}
    )  # fmt: skip
    for request_id in after:
        row = rows[request_id]
        usage = Usage(
            row.uncached_tokens, row.cache_read_tokens, row.cache_write_tokens, row.output_tokens
        )
        assert Decimal(row.cost_total) == compute(usage, rates).total > 0


def admin(
    pair: Pair, name: str, method: str, path: str, body: object = None
) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        pair.gateway(name).url + path,
        data=None if body is None else orjson.dumps(body),
        method=method,
        headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, orjson.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def refused_everywhere(pair: Pair, key: str) -> list[int]:
    """What every request right after gets: 401s, on each of A's workers and on B."""
    statuses = []
    for name, count in PER_GATEWAY.items():
        for _ in range(count):
            try:
                pair.ask(name, key)
                statuses.append(200)
            except openai.AuthenticationError as error:
                statuses.append(error.status_code)
    return statuses


def test_a_key_revoked_through_the_api_stops_at_once_on_every_worker_and_gateway(
    pair: Pair,
) -> None:
    for round in range(3):
        status, issued = admin(pair, "b", "POST", "/v1/admin/keys", {"tenant": "fresh"})
        assert status == 201 and issued["key"].startswith("kvg-") and issued["tenant"] == "fresh"
        # Issued on B, good at once on A's workers.
        for _ in range(PER_GATEWAY["a"]):
            pair.ask("a", issued["key"])
        status, revoked = admin(
            pair, "a" if round % 2 else "b", "DELETE", f"/v1/admin/keys/{issued['id']}"
        )
        assert status == 200 and revoked["id"] == issued["id"] and revoked["revoked"]
        assert refused_everywhere(pair, issued["key"]) == [401] * sum(PER_GATEWAY.values())


def test_a_key_revoked_with_the_cli_stops_at_once_everywhere(pair: Pair) -> None:
    key, key_id = cli_tenant(pair.env, "cli-revoked")
    pair.ask("b", key)
    kvgate("keys", "revoke", key_id, env=pair.env)
    assert refused_everywhere(pair, key) == [401] * sum(PER_GATEWAY.values())
