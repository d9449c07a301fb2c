"""`kvgate prices correct`: the table of what an entry billed and should have, a dry run
that stores nothing, adjustments applied once, and clear refusals (exit 2)."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from gateway.cli import app
from gateway.db.models import PriceAdjustmentRow, RequestRow
from gateway.db.session import make_engine, session_factory
from tests.support.corrections import ENTRY, corrections_world
from tests.support.processes import kvgate

RATES = ["--input", "0.3333", "--cache-read", "0.0333"]
REASON = ["--reason", "input and cache read were keyed in wrong"]
# The hand computation of tests/support/corrections.py, as the command prints it.
TABLE = [
    "tenant\tday\tmodel\trequests\tbilled\tcorrected\tdelta",
    "a\t2026-07-01\tm\t2\t0.001432000\t0.001571950\t0.000139950",
    "a\t2026-07-02\tm\t2\t0.000007210\t0.000008183\t0.000000973",
    "b\t2026-07-01\tm\t1\t0.000200000\t0.000333300\t0.000133300",
]


@pytest.fixture
def sessions(database_url: str) -> Iterator[Any]:
    engine = make_engine(database_url)
    corrections_world(engine)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture
def env(database_url: str, sessions: Any) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    environment["KVGATE_DATABASE_URL"] = database_url
    return environment


def correct(env: dict[str, str], *options: str) -> Any:
    arguments = ["prices", "correct", "--entry", ENTRY.id, *options]
    return CliRunner().invoke(app, arguments, env={**env, "COLUMNS": "200"})


def counts(sessions: Any) -> tuple[int, Any]:
    with sessions() as session:
        adjusted = session.scalar(select(func.count()).select_from(PriceAdjustmentRow))
        costs = session.execute(select(RequestRow.request_id, RequestRow.cost_total)).all()
    return int(adjusted or 0), sorted(costs)


def sorted_table(output: str) -> list[str]:
    header, *rows = [line for line in output.splitlines() if "\t" in line]
    return [header, *sorted(rows)]


def test_a_dry_run_prints_and_writes_the_table_and_stores_nothing(
    env: dict[str, str], sessions: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    before = counts(sessions)
    result = correct(env, *RATES, *REASON, "--dry-run")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        f"{ENTRY.id} corrected to input 0.3333, cache_read 0.0333, cache_write 0.25, "
        "cache_write_1h 0.4, output 0.6 (USD per 1M tokens)"
    )
    assert sorted_table(result.output) == TABLE
    written = tmp_path / "correction-m@2026-01-01T00_00_00Z.csv"
    assert lines[-2:] == [
        "dry run: 3 adjustment(s) totalling 0.000274223 USD would be written; nothing was written",
        f"table written to {written}",
    ]
    assert counts(sessions) == before
    rows = sorted(csv.DictReader(written.open()), key=lambda row: (row["tenant"], row["day"]))
    assert [
        (r["price_id"], r["tenant"], r["day"], r["model"], r["requests"], r["billed"], r["delta"])
        for r in rows
    ] == [
        (ENTRY.id, "a", "2026-07-01", "m", "2", "0.001432000", "0.000139950"),
        (ENTRY.id, "a", "2026-07-02", "m", "2", "0.000007210", "0.000000973"),
        (ENTRY.id, "b", "2026-07-01", "m", "1", "0.000200000", "0.000133300"),
    ]
    assert {(r["recorded"], r["adjusted"], r["currency"]) for r in rows[2:]} == {
        ("0.000200000", "0.000000000", "USD")
    }
    elsewhere = tmp_path / "out" / "fix.csv"
    elsewhere.parent.mkdir()
    named = correct(env, *RATES, *REASON, "--dry-run", "--csv", str(elsewhere))
    assert named.output.splitlines()[-1] == f"table written to {elsewhere}"
    assert elsewhere.read_text() == written.read_text()
    nowhere = correct(env, *RATES, *REASON, "--dry-run", "--csv", str(tmp_path / "no" / "x.csv"))
    assert nowhere.exit_code == 2 and "Traceback" not in nowhere.output
    assert f"--csv {tmp_path / 'no' / 'x.csv'}: No such file or directory (nothing was" in (
        " ".join(nowhere.output.split())
    )


def test_applying_writes_adjustments_once_with_who_and_why(
    env: dict[str, str], sessions: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _, costs = counts(sessions)
    first = correct(env, *RATES, *REASON, "--by", "alice")
    assert first.exit_code == 0, first.output
    assert sorted_table(first.output) == TABLE
    assert first.output.splitlines()[-1] == "applied: 3 adjustment(s) totalling 0.000274223 USD"
    assert list(tmp_path.glob("*.csv")) == []  # no CSV unless asked for
    assert counts(sessions) == (3, costs)  # the records keep their cost
    with sessions() as session:
        rows = session.scalars(select(PriceAdjustmentRow)).all()
    assert {(r.price_id, r.created_by, r.reason) for r in rows} == {
        (ENTRY.id, "alice", "input and cache read were keyed in wrong")
    }
    again = correct(env, "--input", "0.33330", "--cache-read", "0.0333", *REASON)
    assert again.exit_code == 0, again.output
    assert again.output.splitlines()[-1] == (
        "nothing to adjust: billed already matches (this correction was applied before: "
        "3 adjustment(s))"
    )
    assert [line.split("\t")[-1] for line in sorted_table(again.output)[1:]] == ["0.000000000"] * 3
    assert counts(sessions) == (3, costs)


def test_by_defaults_to_the_operating_system_user(env: dict[str, str], sessions: Any) -> None:
    import pwd

    assert correct(env, *RATES, *REASON).exit_code == 0
    with sessions() as session:
        by = set(session.scalars(select(PriceAdjustmentRow.created_by)))
    assert by == {pwd.getpwuid(os.getuid()).pw_name}


def test_an_unknown_entry_and_bad_rates_are_refused_with_exit_2(
    env: dict[str, str], sessions: Any
) -> None:
    unknown = kvgate(
        "prices",
        "correct",
        "--entry",
        "m@1999-01-01T00:00:00Z",
        *RATES,
        *REASON,
        env=env,
        check=False,
    )
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "error: no price entry 'm@1999-01-01T00:00:00Z' (`kvgate prices list` shows them)"
    )
    negative = correct(env, "--input", "-1", "--cache-read", "0.03", *REASON)
    assert negative.exit_code == 2
    assert "--input: must be a finite non-negative number, got '-1'" in negative.output
    word = correct(env, *RATES, "--output", "lots", *REASON)
    assert word.exit_code == 2
    assert "--output: not a number: 'lots'" in word.output
    blank = correct(env, *RATES, "--reason", " ")
    assert blank.exit_code == 2
    assert "--reason must say why the entry is corrected" in blank.output
    assert counts(sessions)[0] == 0
