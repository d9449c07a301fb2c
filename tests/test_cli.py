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
        "2030-12-01T12:00:00+01:00",
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
    assert added.stdout.strip() == "m@2030-12-01T11:00:00Z: added"
    listed = kvgate("prices", "list", "--model", "m", env=env).stdout.strip().splitlines()
    assert listed[1].split("\t") == [
        "m",
        "2030-12-01T11:00:00Z",
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
        "2030-12-01",
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
    listed = kvgate("keys", "list", "--tenant", "acme", env=env).stdout.splitlines()
    assert listed[0] == "id\ttenant\tcreated\trevoked"
    assert [line.split("\t")[:2] + line.split("\t")[3:] for line in listed[1:]] == [
        [key_id, "acme", ""]
    ]
    assert kvgate("keys", "revoke", key_id, env=env).stdout.strip() == f"key {key_id} revoked"
    [line] = kvgate("keys", "list", env=env).stdout.splitlines()[1:]
    assert line.split("\t")[3].endswith("Z") and out[-1] not in line
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

    def record(n: int, uncached: int, cached: int, ceiling: int) -> Record:
        return Record(
            request_id=f"r{n}",
            tenant_id=tenant_id,
            api_key_id="k",
            interaction_id=f"i{n}",
            model="m",
            deployment="m",
            upstream="http://r",
            started_at=start + timedelta(minutes=n),
            ended_at=start + timedelta(minutes=n, seconds=1),
            status=Status.COMPLETED,
            usage=Usage(uncached, cached, 0, 1),
            cost=Cost(),
            ceiling_cached_tokens=ceiling,
            predicted_cached_tokens=cached,
        )

    # 1000 prompt tokens: 300 read from cache, 400 could have been.
    insert_records(engine, [record(1, 500, 0, 0), record(2, 200, 300, 400)])
    engine.dispose()
    out = kvgate("ceiling", "--start", "2026-11-02", "--end", "2026-11-02", env=env).stdout
    assert out.strip().splitlines() == [
        "tenant\tmodel\tprompt_tokens\thit_rate\tceiling\tefficiency",
        "acme\tm\t1000\t30.00%\t40.00%\t75.00%",
    ]


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
