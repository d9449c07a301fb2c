"""`kvgate reconcile invoice` as users run it (real subprocesses), on SQLite and Postgres:
records inserted through the recorder's writer against the fixture exports
(tests/fixtures/invoices), variance included, to the token and the nano-dollar."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.accounting.records import Status
from gateway.accounting.store import insert_records
from gateway.db.session import make_engine
from gateway.usage import Usage
from pricing.book import PriceBook
from tests.factories import price, record
from tests.support.processes import kvgate

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "invoices"
BOOK = PriceBook(
    [
        price("gpt-4o-mini", "2025-01-01", input="0.15", cache_read="0.075", output="0.60"),
        price("gpt-4o", "2025-01-01", input="2.50", cache_read="1.25", output="10.00"),
        price(
            "claude-sonnet-4-5",
            "2025-01-01",
            input="3",
            cache_read="0.30",
            cache_write="3.75",
            output="15",
        ),
        price("claude-3-5-haiku-latest", "2025-01-01", input="0.80", cache_read="0.08", output="4"),
        price("m", "2025-01-01"),
    ]
)


def at(day: int, hour: int = 10) -> datetime:
    return datetime(2025, 8, day, hour, tzinfo=UTC)


def hosted(name: str, day: int, upstream: str, model: str, usage: Usage, **fields: Any) -> Any:
    return record(
        name,
        started_at=at(day, fields.pop("hour", 10)),
        model=model,
        deployment=model,
        upstream=upstream,
        usage=usage,
        prices=BOOK,
        **fields,
    )


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    environment["KVGATE_DATABASE_URL"] = database_url
    engine = make_engine(database_url)
    try:
        insert_records(
            engine,
            [
                # OpenAI, through litellm: the alias kvgate sent, snapshots billed.
                hosted("o1", 1, "openai/gpt-4o-mini", "gpt-4o-mini", Usage(800, 200, 0, 100)),
                hosted(
                    "o2",
                    1,
                    "openai/gpt-4o-mini",
                    "gpt-4o-mini",
                    Usage(1000, 1000, 0, 300),
                    status=Status.FAILED,
                ),
                hosted("o3", 2, "gpt-4o", "gpt-4o", Usage(500, 0, 0, 50), hour=23),
                hosted("o4", 3, "openai/gpt-4o-mini", "gpt-4o-mini", Usage(100, 0, 0, 10), hour=0),
                hosted("o5", 4, "openai/gpt-4o-mini", "gpt-4o-mini", Usage(7, 0, 0, 7)),  # after
                # Anthropic.
                hosted(
                    "a1",
                    1,
                    "anthropic/claude-sonnet-4-5",
                    "claude-sonnet-4-5",
                    Usage(300, 5000, 1000, 200),
                ),
                hosted(
                    "a2",
                    1,
                    "anthropic/claude-sonnet-4-5",
                    "claude-sonnet-4-5",
                    Usage(200, 0, 0, 100),
                ),
                hosted(
                    "a3",
                    2,
                    "claude-3-5-haiku-latest",
                    "claude-3-5-haiku-latest",
                    Usage(1000, 0, 0, 100),
                ),
                # Self-hosted vLLM: never on a provider's bill.
                hosted("v1", 1, "http://10.0.0.5:8000", "m", Usage(9000, 9000, 0, 900)),
            ],
        )
    finally:
        engine.dispose()
    return environment


def both(tmp_path: Path, name: str, document: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def cell(kvgate: Any, provider: Any, variance: Any, percent: str | None) -> dict[str, Any]:
    return {"kvgate": kvgate, "provider": provider, "variance": variance, "percent": percent}


def test_openai_bill_against_records_per_day_and_model(env: dict[str, str], tmp_path: Path) -> None:
    export = both(
        tmp_path,
        "openai.json",
        {"usage": fixture("openai_usage.json"), "costs": fixture("openai_costs.json")},
    )
    done = kvgate(
        "reconcile", "invoice", str(export), "--provider", "openai", "--format", "json", env=env
    )
    rows = json.loads(done.stdout)
    assert rows == [
        {
            "day": "2025-08-01",
            "model": "gpt-4o-mini",
            "provider_models": ["gpt-4o-mini-2024-07-18"],
            "requests": {"kvgate": 2, "provider": 3},
            "tokens": {
                "uncached": cell(1800, 1900, -100, "-5.26"),
                "cache_read": cell(1200, 1200, 0, "0.00"),
                "cache_write": cell(0, 0, 0, None),
                "output": cell(400, 410, -10, "-2.44"),
            },
            "cost_usd": cell("0.000600000", "0.000621000", "-0.000021000", "-3.38"),
        },
        {
            "day": "2025-08-02",
            "model": "gpt-4.1-nano-2025-04-14",
            "provider_models": ["gpt-4.1-nano-2025-04-14"],
            "requests": {"kvgate": 0, "provider": 1},
            "tokens": {
                "uncached": cell(0, 40, -40, "-100.00"),
                "cache_read": cell(0, 0, 0, None),
                "cache_write": cell(0, 0, 0, None),
                "output": cell(0, 5, -5, "-100.00"),
            },
            "cost_usd": cell("0.000000000", "0.000006000", "-0.000006000", "-100.00"),
        },
        {
            "day": "2025-08-02",
            "model": "gpt-4o",
            "provider_models": ["gpt-4o-2024-08-06"],
            "requests": {"kvgate": 1, "provider": 1},
            "tokens": {
                "uncached": cell(500, 520, -20, "-3.85"),
                "cache_read": cell(0, 0, 0, None),
                "cache_write": cell(0, 0, 0, None),
                "output": cell(50, 50, 0, "0.00"),
            },
            "cost_usd": cell("0.001750000", "0.001800000", "-0.000050000", "-2.78"),
        },
        {
            "day": "2025-08-02",
            "model": "web search tool calls",
            "provider_models": ["web search tool calls"],
            "requests": {"kvgate": 0, "provider": 0},
            "tokens": {
                name: cell(0, 0, 0, None)
                for name in ("uncached", "cache_read", "cache_write", "output")
            },
            "cost_usd": cell("0.000000000", "0.010000000", "-0.010000000", "-100.00"),
        },
        {
            "day": "2025-08-03",
            "model": "gpt-4o-mini",
            "provider_models": [],
            "requests": {"kvgate": 1, "provider": 0},
            "tokens": {
                "uncached": cell(100, 0, 100, None),
                "cache_read": cell(0, 0, 0, None),
                "cache_write": cell(0, 0, 0, None),
                "output": cell(10, 0, 10, None),
            },
            "cost_usd": cell("0.000021000", "0.000000000", "0.000021000", None),
        },
    ]
    assert done.stderr.splitlines() == ["2025-08-01 to 2025-08-03: 5 day × model, 5 apart"]

    table = kvgate(
        "reconcile",
        "invoice",
        str(export),
        "--provider",
        "openai",
        "--until",
        "2025-08-01",
        env=env,
    )
    assert table.stdout.splitlines() == [
        "day\tmodel\tmeasure\tkvgate\tprovider\tvariance\tpercent",
        "2025-08-01\tgpt-4o-mini\trequests\t2\t3\t-\t-",
        "2025-08-01\tgpt-4o-mini\tuncached\t1800\t1900\t-100\t-5.26%",
        "2025-08-01\tgpt-4o-mini\tcache_read\t1200\t1200\t0\t+0.00%",
        "2025-08-01\tgpt-4o-mini\tcache_write\t0\t0\t0\t-",
        "2025-08-01\tgpt-4o-mini\toutput\t400\t410\t-10\t-2.44%",
        "2025-08-01\tgpt-4o-mini\tcost_usd\t0.000600000\t0.000621000\t-0.000021000\t-3.38%",
    ]


def test_anthropic_bill_as_a_list_of_pages_and_a_usage_report_alone(
    env: dict[str, str], tmp_path: Path
) -> None:
    export = both(
        tmp_path,
        "anthropic.json",
        [fixture("anthropic_usage.json"), fixture("anthropic_costs.json")],
    )
    done = kvgate(
        "reconcile", "invoice", str(export), "--provider", "anthropic", "--format", "json", env=env
    )
    rows = json.loads(done.stdout)
    assert [(r["day"], r["model"], r["provider_models"]) for r in rows] == [
        ("2025-08-01", "claude-sonnet-4-5", ["claude-sonnet-4-5-20250929"]),
        ("2025-08-02", "(unattributed)", ["(unattributed)"]),
        ("2025-08-02", "claude-3-5-haiku-latest", ["claude-3-5-haiku-20241022"]),
    ]
    sonnet, unattributed, haiku = rows
    assert sonnet["requests"] == {"kvgate": 2, "provider": None}  # its report counts none
    assert sonnet["tokens"] == {
        "uncached": cell(500, 500, 0, "0.00"),
        "cache_read": cell(5000, 5000, 0, "0.00"),
        "cache_write": cell(1000, 1000, 0, "0.00"),
        "output": cell(300, 320, -20, "-6.25"),
    }
    # 0.0009 + 0.0015 + 0.00375 + 0.003 and 0.0006 + 0.0015, against 1.155 cents.
    assert sonnet["cost_usd"] == cell("0.011250000", "0.011550000", "-0.000300000", "-2.60")
    assert unattributed["cost_usd"] == cell("0.000000000", "0.010000000", "-0.010000000", "-100.00")
    assert haiku["tokens"]["uncached"] == cell(1000, 1000, 0, "0.00")
    assert haiku["cost_usd"] == cell("0.001200000", "0.001200000", "0.000000000", "0.00")
    assert done.stderr.splitlines() == ["2025-08-01 to 2025-08-02: 3 day × model, 2 apart"]

    usage_only = kvgate(
        "reconcile",
        "invoice",
        str(FIXTURES / "anthropic_usage.json"),
        "--provider",
        "anthropic",
        "--since",
        "2025-07-31",
        "--format",
        "json",
        env=env,
    )
    [sonnet, haiku] = json.loads(usage_only.stdout)
    assert sonnet["cost_usd"] == cell("0.011250000", None, None, None)
    assert haiku["tokens"]["output"] == cell(100, 100, 0, "0.00")
    assert usage_only.stderr.splitlines() == [
        "the file holds no cost report: cost is not compared",
        "2025-07-31 to 2025-08-02: 2 day × model, 1 apart",
    ]


def test_a_malformed_file_or_wrong_options_exit_2_saying_what_is_wrong(tmp_path: Path) -> None:
    """Refused before any database is opened: once, not per database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env["KVGATE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'never.db'}"
    broken = both(tmp_path, "broken.json", {"data": [{"start_time": "monday", "results": []}]})
    done = kvgate("reconcile", "invoice", str(broken), "--provider", "openai", env=env, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: {broken}: page.data[0].start_time must be a Unix time in seconds, not 'monday'"
    )
    empty = both(tmp_path, "empty.json", {"data": []})
    for args, message in [
        (
            (str(empty), "--provider", "openai"),
            "the file holds no buckets: give --since and --until",
        ),
        (
            (str(empty), "--provider", "azure"),
            "--provider must be openai or anthropic, not 'azure'",
        ),
        ((str(empty), "--provider", "openai", "--since", "1 Aug"), "--since must be a day"),
        (
            (str(empty), "--provider", "openai", "--since", "2025-08-02", "--until", "2025-08-01"),
            "--until must not be before --since",
        ),
    ]:
        done = kvgate("reconcile", "invoice", *args, env=env, check=False)
        assert done.returncode == 2, args
        assert message in done.stderr, (args, done.stderr)
    assert not (tmp_path / "never.db").exists()
