"""The kvgate CLI as users run it (real subprocesses), on SQLite and Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.db.session import make_engine
from gateway.usage import Usage
from tests.factories import record, tenants
from tests.factories import record as make_record
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


def test_budgets_and_limits_list_a_tab_separated_line_each_until_deleted(
    env: dict[str, str],
) -> None:
    kvgate("tenants", "create", "acme", env=env)
    made = kvgate(
        "budgets", "set", "--scope", "tenant:acme", "--limit", "5", "--period", "day", env=env
    ).stdout.split()
    budget_id = made[1].rstrip(":")
    listed = kvgate("budgets", "list", env=env).stdout.splitlines()
    assert listed[0] == "id\tscope\tlimit\tperiod\ttimezone\talert_at\tspent\treserved\twebhook"
    [fields] = [line.split("\t") for line in listed[1:]]
    # Spent and reserved (fields 6 and 7) are the counter's zeros.
    assert fields[:6] + fields[8:] == [
        budget_id,
        "tenant:acme",
        "5.000000000",  # as stored: Numeric(18, 9)
        "day",
        "UTC",
        "0.5,0.8,1.0",
        "-",
    ]
    out = kvgate(
        "limits", "set", "--scope", "tenant:acme", "--requests-per-minute", "60", env=env
    ).stdout.strip()
    limit_id = out.split()[1].rstrip(":")
    assert out == f"limit {limit_id}: tenant:acme 60 requests, - tokens per minute"
    assert kvgate("limits", "list", env=env).stdout.splitlines() == [
        "id\tscope\trequests_per_minute\ttokens_per_minute",
        f"{limit_id}\ttenant:acme\t60\t-",
    ]
    deleted = kvgate("limits", "delete", limit_id, env=env).stdout.strip()
    assert deleted == f"limit {limit_id} deleted"
    deleted = kvgate("budgets", "delete", budget_id, env=env).stdout.strip()
    assert deleted == f"budget {budget_id} deleted"
    assert len(kvgate("limits", "list", env=env).stdout.splitlines()) == 1
    assert len(kvgate("budgets", "list", env=env).stdout.splitlines()) == 1


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

    def made(
        n: int, uncached: int, cached: int, ceiling: int, model: str = "m", exact: bool = True
    ) -> Record:
        return record(
            f"r{n}",
            tenant_id=tenant_id,
            model=model,
            started_at=start + timedelta(minutes=n),
            usage=Usage(uncached, cached, 0, 1),
            prices=None,
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
            made(1, 500, 0, 0),
            made(2, 200, 300, 400),
            made(3, 100, 192, 160, model="text", exact=False),
            made(4, 100, 32, 48, model="text", exact=False),
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
    total = dict(zip(out[0].split(","), out[1].split(","), strict=True))
    assert (total["day"], total["cost_total"], total["currency"]) == ("TOTAL", "0.000000000", "")
    assert (total["cost_per_completed_interaction"], total["unpriced_requests"]) == ("", "0")


def test_billing_statement_prints_the_apis_bytes_with_unpriced_and_estimated_lines(
    env: dict[str, str], database_url: str
) -> None:
    """The CLI's statement is ``billing.render``'s bytes, which both APIs serve: unpriced
    lines without cost, estimated usage on lines of its own, priced cost per interaction."""
    from datetime import date

    from gateway import billing
    from gateway.db import crud
    from gateway.db.session import session_factory
    from gateway.usage import UsageSource
    from pricing.book import price_from_mapping

    price = price_from_mapping(
        {
            "model": "m",
            "effective_from": "2026-01-01",
            "input": "0.15",
            "cache_read": "0.015",
            "output": "0.45",
        }
    )
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    tenant_id = tenants(engine, "acme", prices=[price])["acme"].id
    start = datetime(2026, 11, 2, 9, tzinfo=UTC)

    def record(n: int, model: str, usage: Usage, status: Status) -> Record:
        return make_record(
            f"r{n}",
            tenant_id=tenant_id,
            interaction_id=f"i{n}",
            model=model,
            upstream="http://r",
            started_at=start + timedelta(minutes=n),
            status=status,
            usage=usage,
            prices=price if model == "m" else None,
        )

    estimated = Usage(50, 0, 0, 5, source=UsageSource.ESTIMATED)
    insert_records(
        engine,
        [
            record(1, "m", Usage(1000, 0, 0, 10), Status.COMPLETED),
            record(2, "m", estimated, Status.CANCELLED),
            record(3, "free", Usage(20, 0, 0, 2), Status.COMPLETED),
        ],
    )
    with sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="acme"),
            start=date(2026, 11, 2),
            end=date(2026, 11, 2),
        )
    engine.dispose()
    for fmt in ("json", "csv"):
        command = ["billing", "statement", "--tenant", "acme", "--start", "2026-11-02"]
        printed = subprocess.run(
            [sys.executable, "-m", "gateway.cli", *command, "--end", "2026-11-02", "--format", fmt],
            env=env,
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout  # bytes, as written
        assert printed == billing.render(statement, fmt)[0], fmt
    document = json.loads(billing.render(statement, "json")[0])
    assert [
        (line["model"], line["usage_source"], line["priced"], line["cost_total"])
        for line in document["line_items"]
    ] == [
        ("free", "reported", False, None),
        # 1000 × 0.15 + 10 × 0.45 per 1M
        ("m", "reported", True, "0.000154500"),
        # 50 × 0.15 + 5 × 0.45 per 1M, on estimated usage
        ("m", "estimated", True, "0.000009750"),
    ]
    totals = document["totals"]
    # (0.0001545 + 0.00000975) over i1 alone: i3 completed unpriced and is counted beside it.
    assert (
        totals["cost_per_completed_interaction"],
        totals["unpriced_interaction_share"],
        totals["unpriced_requests"],
        totals["unpriced_tokens"],
    ) == ("0.000164250", "0.500000000", 1, 22)


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


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (
            ["billing", "statement", "--tenant", "acme", "--start", "x", "--end", "2026-11-30"],
            "--start",
        ),
        (
            [
                "billing",
                "statement",
                "--tenant",
                "acme",
                "--start",
                "2026-11-01",
                "--end",
                "2026-13-01",
            ],
            "--end",
        ),
        (["ceiling", "--start", "2026-11-01", "--end", "yesterday"], "--end"),
        (["prices", "import-litellm", "--captured-on", "soon", "--dry-run"], "--captured-on"),
        (
            ["reconcile", "invoice", "bill.json", "--provider", "openai", "--since", "1/11/2026"],
            "--since",
        ),
    ],
)
def test_a_day_that_is_not_one_is_refused_naming_the_option(
    env: dict[str, str], command: list[str], option: str
) -> None:
    kvgate("tenants", "create", "acme", env=env)
    result = kvgate(*command, env=env, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"error: {option} must be a day, YYYY-MM-DD, not " in result.stderr


def test_ceiling_refuses_an_end_before_its_start(env: dict[str, str]) -> None:
    result = kvgate("ceiling", "--start", "2026-11-02", "--end", "2026-11-01", env=env, check=False)
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "error: --end must not be before --start",
    )


@pytest.mark.parametrize("command", ["upgrade", "downgrade"])
def test_an_unknown_revision_is_refused_naming_it(env: dict[str, str], command: str) -> None:
    result = kvgate("db", command, "no-such-revision", env=env, check=False)
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "error: Can't locate revision identified by 'no-such-revision'",
    )


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["tenants", "create", "n" * 201], "a tenant's name is 1 to 200 printable characters"),
        (["tenants", "create", ""], "a tenant's name is 1 to 200 printable characters"),
        (
            ["tenants", "create", "beta", "--cache-group", "g" * 201],
            "a cache group is 1 to 200 printable characters",
        ),
        (
            ["tenants", "set-group", "acme", "--cache-group", "g" * 201],
            "a cache group is 1 to 200 printable characters",
        ),
    ],
)
def test_a_name_the_tenants_columns_cannot_hold_is_refused(
    env: dict[str, str], command: list[str], message: str
) -> None:
    kvgate("tenants", "create", "acme", env=env)
    result = kvgate(*command, env=env, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: {message}, not ")
