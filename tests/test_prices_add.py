"""`kvgate prices add`: every option the catalog has, and no silent backdating.

Each option round-trips into the stored entry (exactly the entry the same YAML would give)
and into the price the gateway uses: the book loaded as the gateway loads it, through the
ledger that prices every record. A price in the past is refused unless --backdate is given;
then the command says how many records already fall after it, and they keep their price.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from gateway.accounting.ledger import Ledger, Priced
from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.auth import Principal
from gateway.cli import app
from gateway.db import crud
from gateway.db.models import RequestRow
from gateway.db.session import make_engine, session_factory
from gateway.directory.snapshot import price_document, prices_from
from gateway.usage import Usage
from pricing.book import price_from_mapping
from pricing.cost import Cost
from tests.support.processes import kvgate

FUTURE = "2031-03-01T00:00:00Z"
ALICE = Principal("ten_a", "alice", "key_a", "tenant:ten_a")


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    environment["KVGATE_DATABASE_URL"] = database_url
    return environment


@pytest.fixture
def sessions(database_url: str) -> Iterator[Any]:
    engine = make_engine(database_url)
    yield session_factory(engine)
    engine.dispose()


def add(env: dict[str, str], *options: str, check: bool = True) -> Any:
    return kvgate(
        "prices",
        "add",
        "--model",
        "m",
        "--input",
        "3",
        "--cache-read",
        "0.3",
        "--output",
        "15",
        *options,
        env=env,
        check=check,
    )


def stored(sessions: Any) -> Any:
    with sessions() as session:
        revision, book = crud.current_prices(session)
    [price] = book.entries("m")
    return revision, book, price


def ledger_record(book: Any, usage: Usage, tier: str | None = None) -> Priced:
    """How the ledger prices ``usage`` of model m on 2031-03-02, in ``tier``."""
    ledger = Ledger(book=book, recorder=None)  # type: ignore[arg-type]
    return ledger.price("m", at=datetime(2031, 3, 2, tzinfo=UTC), usage=usage, tier=tier)


def test_every_catalog_option_round_trips_into_the_entry_and_the_price_used(
    env: dict[str, str], sessions: Any
) -> None:
    result = add(
        env,
        "--effective-from",
        FUTURE,
        "--cache-write",
        "3.75",
        "--cache-write-1h",
        "6",
        "--long-context-above",
        "200000",
        "--long-context-input",
        "6",
        "--long-context-cache-read",
        "0.6",
        "--long-context-cache-write",
        "7.5",
        "--long-context-cache-write-1h",
        "12",
        "--long-context-output",
        "22.5",
        "--tier",
        "priority:input=5,cache_read=0.5,output=25",
        "--tier",
        "flex:input=1.5,cache_read=0.15,output=7.5,cache_write=1.875,cache_write_1h=3",
    )
    assert result.stdout.strip() == "m@2031-03-01T00:00:00Z: added"
    revision, book, price = stored(sessions)
    same_yaml = price_from_mapping(
        {
            "model": "m",
            "effective_from": FUTURE,
            "input": "3",
            "cache_read": "0.3",
            "cache_write": "3.75",
            "cache_write_1h": "6",
            "output": "15",
            "source": "kvgate prices add",
            "captured_on": price.captured_on,
            "long_context": {
                "above": 200000,
                "input": "6",
                "cache_read": "0.6",
                "cache_write": "7.5",
                "cache_write_1h": "12",
                "output": "22.5",
            },
            "tiers": {
                "priority": {"input": "5", "cache_read": "0.5", "output": "25"},
                "flex": {
                    "input": "1.5",
                    "cache_read": "0.15",
                    "output": "7.5",
                    "cache_write": "1.875",
                    "cache_write_1h": "3",
                },
            },
        }
    )
    assert price == same_yaml and revision == 1  # the change was announced
    # The local snapshot keeps it exactly too.
    assert prices_from([price_document(price)]).entries("m") == [same_yaml]

    # The price used: 1,000,000 tokens of each class at the rates each option set.
    writes = Usage(1_000_000, 1_000_000, 2_000_000, 1_000_000, cache_write_1h_tokens=1_000_000)
    standard = ledger_record(book, Usage(100, 0, 2_000_000, 0, cache_write_1h_tokens=1_000_000))
    assert standard.rate_class == "long_context"  # 2,000,100 prompt tokens > 200,000
    assert standard.cost.cache_write == Decimal("19.500000000")  # 7.5 + 12
    short = ledger_record(book, Usage(100_000, 0, 100_000, 0, cache_write_1h_tokens=50_000))
    assert short.rate_class == "standard"
    assert short.cost.cache_write == Decimal("0.487500000")  # 50k at 3.75 + 50k at 6
    assert short.cost.uncached == Decimal("0.300000000")
    priority = ledger_record(book, writes, tier="priority")
    assert priority.rate_class == "priority"
    assert (priority.cost.uncached, priority.cost.cache_read, priority.cost.output) == (
        Decimal("5.000000000"),
        Decimal("0.500000000"),
        Decimal("25.000000000"),
    )
    flex = ledger_record(book, writes, tier="flex")
    assert flex.rate_class == "flex" and flex.cost.cache_write == Decimal("4.875000000")
    long = ledger_record(book, writes)
    assert long.rate_class == "long_context"
    assert long.cost.total == Decimal("6") + Decimal("0.6") + Decimal("19.5") + Decimal("22.5")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--long-context-input", "6"), "need --long-context-above"),
        (("--long-context-above", "1000", "--long-context-input", "6"), "long_context.cache_read"),
        (("--tier", "priority"), "expected NAME:input=R"),
        (("--tier", "priority:input=5,cache_read=0.5"), "tiers.priority.output"),
        (("--tier", "priority:input=5,cache_read=0.5,output=1,speed=2"), "unknown fields"),
        (("--tier", "standard:input=5,cache_read=0.5,output=1"), "standard tier"),
        (("--tier", "p:input=1,cache_read=1,output=1", "--tier", "p:input=1"), "given twice"),
        (("--cache-write-1h", "-1"), "non-negative"),
        (("--long-context-above", "0"), "--long-context-above"),
    ],
)
def test_incomplete_or_wrong_options_are_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, options: tuple[str, ...], message: str
) -> None:
    """Refused before the database is touched (it has no tables here: reaching it fails
    with another message)."""
    monkeypatch.setenv("KVGATE_DATABASE_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    arguments = ["prices", "add", "--model", "m", "--effective-from", FUTURE]
    rates = ["--input", "3", "--cache-read", "0.3", "--output", "15"]
    result = CliRunner().invoke(app, [*arguments, *rates, *options], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and message in result.output, result.output


def record(n: int, started_at: datetime, price_id: str | None, model: str = "m") -> Record:
    return Record(
        request_id=f"r{n}",
        tenant_id="ten_a",
        api_key_id="k",
        interaction_id=f"i{n}",
        model=model,
        deployment=model,
        upstream="http://r",
        started_at=started_at,
        ended_at=started_at + timedelta(seconds=1),
        status=Status.COMPLETED,
        usage=Usage(1000, 0, 0, 10),
        price_id=price_id,
        cost=Cost(uncached=Decimal("0.001000000")),
    )


def test_a_past_effective_from_is_refused_unless_backdated_and_history_is_kept(
    env: dict[str, str], sessions: Any, database_url: str
) -> None:
    old = add(env, "--effective-from", "2020-01-01", "--backdate")
    assert old.stdout.splitlines() == [
        "m@2020-01-01T00:00:00Z: added",
        "backdated: 0 record(s) of m started at or after 2020-01-01T00:00:00Z; they keep the "
        "price they were recorded with (history is never rewritten)",
    ]
    now = datetime.now(UTC).replace(microsecond=0)
    an_hour_ago = now - timedelta(hours=1)
    engine = make_engine(database_url)
    insert_records(
        engine,
        [
            record(1, an_hour_ago - timedelta(minutes=1), "m@2020-01-01T00:00:00Z"),  # before
            record(2, an_hour_ago, "m@2020-01-01T00:00:00Z"),  # at: counted
            record(3, an_hour_ago + timedelta(minutes=5), "m@2020-01-01T00:00:00Z"),
            record(4, an_hour_ago + timedelta(minutes=6), None),  # unpriced, same name
            record(5, an_hour_ago + timedelta(minutes=7), "other@2020-01-01T00:00:00Z", "o"),
            record(6, an_hour_ago + timedelta(minutes=8), "m_x@2020-01-01T00:00:00Z", "m_x"),
        ],
    )
    engine.dispose()
    when = an_hour_ago.isoformat()
    refused = add(env, "--effective-from", when, "--input", "4", check=False)
    assert refused.returncode == 2
    assert "is in the past" in refused.stderr and "--backdate" in refused.stderr
    backdated = add(env, "--effective-from", when, "--input", "4", "--backdate")
    moment = f"{an_hour_ago:%Y-%m-%dT%H:%M:%SZ}"
    assert backdated.stdout.splitlines() == [
        f"m@{moment}: added",
        f"backdated: 3 record(s) of m started at or after {moment}; they keep the price they "
        "were recorded with (history is never rewritten)",
    ]
    with sessions() as session:
        rows = session.execute(select(RequestRow.request_id, RequestRow.price_id)).all()
        assert sorted(rows) == [
            ("r1", "m@2020-01-01T00:00:00Z"),
            ("r2", "m@2020-01-01T00:00:00Z"),
            ("r3", "m@2020-01-01T00:00:00Z"),
            ("r4", None),
            ("r5", "other@2020-01-01T00:00:00Z"),
            ("r6", "m_x@2020-01-01T00:00:00Z"),
        ]
    # "now" is this second, and needs no --backdate; the current second is not the past.
    current = add(env, "--effective-from", "now", "--input", "5")
    assert current.returncode == 0 and current.stdout.strip().endswith(": added")
    this_second = datetime.now(UTC).replace(microsecond=0).isoformat()
    assert add(env, "--effective-from", this_second, "--input", "5", check=False).returncode in (
        0,
        2,  # the same second as "now" above: the same id with another source is refused
    )


def test_help_names_every_catalog_option() -> None:
    help = CliRunner().invoke(app, ["prices", "add", "--help"], env={"COLUMNS": "200"})
    text = " ".join(help.output.split())
    for option in (
        "--cache-write-1h",
        "--long-context-above",
        "--long-context-input",
        "--long-context-cache-read",
        "--long-context-cache-write",
        "--long-context-cache-write-1h",
        "--long-context-output",
        "--tier",
        "--backdate",
    ):
        assert option in text, option
