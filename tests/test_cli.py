"""The kvgate CLI as users run it (real subprocesses), on SQLite and Postgres."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.db.session import make_engine
from gateway.usage import Usage
from pricing.cost import Cost
from tests.support.processes import kvgate


@pytest.fixture
def env(database_url: str, tmp_path: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    environment["KVGATE_DATABASE_URL"] = database_url
    return environment


def test_prices_sync_is_idempotent_and_add_list_show_dated_entries(env: dict[str, str]) -> None:
    assert kvgate("prices", "sync", env=env).stdout.strip() == "prices: 2 added, 0 already present"
    assert kvgate("prices", "sync", env=env).stdout.strip() == "prices: 0 added, 2 already present"
    added = kvgate(
        "prices",
        "add",
        "--model",
        "m",
        "--effective-from",
        "2026-12-01T12:00:00+01:00",
        "--input",
        "3",
        "--cache-read",
        "0.3",
        "--cache-write",
        "3.75",
        "--output",
        "15",
        "--source",
        "vendor list",
        env=env,
    )
    assert added.stdout.strip() == "m@2026-12-01T11:00:00Z: added"
    listed = kvgate("prices", "list", "--model", "m", env=env).stdout.strip().splitlines()
    assert listed[1].split("\t") == [
        "m",
        "2026-12-01T11:00:00Z",
        "3.000000000",
        "0.300000000",
        "3.750000000",
        "15.000000000",
        "USD",
        "vendor list",
    ]
    assert len(kvgate("prices", "list", env=env).stdout.strip().splitlines()) == 1 + 3


def test_a_price_cannot_be_edited_and_bad_rates_are_refused(env: dict[str, str]) -> None:
    base = [
        "prices",
        "add",
        "--model",
        "m",
        "--effective-from",
        "2026-12-01",
        "--cache-read",
        "1",
        "--output",
        "2",
    ]
    kvgate(*base, "--input", "1", env=env)
    again = kvgate(*base, "--input", "9", env=env, check=False)
    assert again.returncode == 2 and "later effective_from" in again.stderr
    bad = kvgate(*base, "--input", "-1", env=env, check=False)
    assert bad.returncode == 2 and "non-negative" in bad.stderr


def test_tenants_and_keys(env: dict[str, str]) -> None:
    kvgate("tenants", "create", "acme", env=env)
    duplicate = kvgate("tenants", "create", "acme", env=env, check=False)
    assert duplicate.returncode == 2 and "already exists" in duplicate.stderr
    out = kvgate("keys", "create", "--tenant", "acme", env=env).stdout.splitlines()
    assert out[-1].startswith("kvg-") and len(out[-1]) > 40
    missing = kvgate("keys", "create", "--tenant", "nobody", env=env, check=False)
    assert missing.returncode == 2 and "no tenant named 'nobody'" in missing.stderr
    key_id = out[0].split()[1]
    assert kvgate("keys", "revoke", key_id, env=env).stdout.strip() == f"key {key_id} revoked"
    unknown = kvgate("keys", "revoke", "key_nope", env=env, check=False)
    assert unknown.returncode == 2


def test_ceiling_reports_achieved_against_ceiling_per_tenant_and_model(
    env: dict[str, str],
    database_url: str,
) -> None:
    kvgate("tenants", "create", "acme", env=env)
    engine = make_engine(database_url)
    with engine.connect() as connection:
        from sqlalchemy import text

        tenant_id = connection.scalar(text("SELECT id FROM tenants WHERE name = 'acme'"))
    start = datetime(2026, 11, 2, 9, tzinfo=UTC)

    def record(
        n: int, uncached: int, cached: int, ceiling: int, model: str = "m", exact: bool = True
    ) -> Record:
        return Record(
            request_id=f"r{n}",
            tenant_id=tenant_id,
            api_key_id="k",
            interaction_id=f"i{n}",
            model=model,
            deployment=model,
            upstream="http://r",
            started_at=start + timedelta(minutes=n),
            ended_at=start + timedelta(minutes=n, seconds=1),
            status=Status.COMPLETED,
            usage=Usage(uncached, cached, 0, 1),
            cost=Cost(),
            ceiling_cached_tokens=ceiling,
            predicted_cached_tokens=cached,
            ceiling_exact=exact,
        )

    # m: 1000 prompt tokens, 300 read from cache, 400 could have been (an exact router).
    # text: a router without tokenizer estimated a ceiling of 160 where the replica read 192
    # (and 32 of 48 on the other): the stored ceilings are 192 and 48, efficiency 224 / 240
    # (the router's own ceilings, 208 in all, would have made it 107.69 %).
    insert_records(
        engine,
        [
            record(1, 500, 0, 0),
            record(2, 200, 300, 400),
            record(3, 100, 192, 160, model="text", exact=False),
            record(4, 100, 32, 48, model="text", exact=False),
        ],
    )
    engine.dispose()
    result = kvgate("ceiling", "--start", "2026-11-02", "--end", "2026-11-02", env=env)
    assert result.stdout.strip().splitlines() == [
        "tenant\tmodel\tprompt_tokens\thit_rate\tceiling\tefficiency\tceiling_kind",
        "acme\tm\t1000\t30.00%\t40.00%\t75.00%\texact",
        "acme\ttext\t424\t52.83%\t56.60%\t93.33%\tapproximate",
    ]
    assert result.stderr.startswith("approximate ceiling for text: counted by a router without")
    only_exact = kvgate(
        "ceiling", "--start", "2026-11-02", "--end", "2026-11-02", "--model", "m", env=env
    )
    assert only_exact.stderr == ""


def test_billing_statement_prints_an_empty_statement_with_totals(env: dict[str, str]) -> None:
    kvgate("tenants", "create", "acme", env=env)
    out = kvgate(
        "billing",
        "statement",
        "--tenant",
        "acme",
        "--start",
        "2026-11-01",
        "--end",
        "2026-11-30",
        "--format",
        "csv",
        env=env,
    ).stdout.splitlines()
    assert out[0].startswith("day,model,price_id")
    assert out[1].startswith("TOTAL,") and out[1].endswith(",0.000000000")


def test_help_is_everywhere() -> None:
    for command in (
        [],
        ["serve"],
        ["sim"],
        ["replay"],
        ["prices", "add"],
        ["keys", "create"],
        ["db", "upgrade"],
        ["ceiling"],
        ["dashboard"],
        ["billing", "statement"],
    ):
        result = kvgate(*command, "--help")
        assert result.returncode == 0 and "Usage:" in result.stdout, command
        assert " ".join(command) in " ".join(result.stdout.split()), command
