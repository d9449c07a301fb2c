"""The cache economics page: break positions ranked per tenant and model with what they
lost, beside what the cache saved; each replica's window against its own counters."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

import orjson
import pytest

from dashboard import formatting
from gateway.accounting.recorder import insert_records
from gateway.db.session import make_engine
from gateway.db.writer.samples import insert_samples
from gateway.usage import Usage
from tests.dashboard.conftest import open_app
from tests.factories import JAN, JUL, record, tenants

CONTEXT = {"offset": 26, "before": "<|system|>\n2026-07-01T10:0", "previous": "1", "current": "2"}


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 7, 1, hour, minute, second, tzinfo=UTC)


@pytest.fixture
def url(database_url: str) -> Iterator[str]:
    engine = make_engine(database_url)
    made = tenants(engine, "acme", "bravo", prices=[JAN, JUL])
    a, b = made["acme"].id, made["bravo"].id
    broke = {"break_early": True, "interaction_id": "c"}
    insert_records(
        engine,
        [
            record("r1", tenant_id=a, started_at=at(10, 0), usage=Usage(1000, 0, 0, 10)),
            record(
                "r2", tenant_id=a, started_at=at(10, 1), usage=Usage(1100, 0, 0, 10),
                break_tokens=0, lost_tokens=1000, **broke,
            ),
            record(
                "r3", tenant_id=a, started_at=at(10, 2), usage=Usage(1200, 0, 0, 10),
                break_tokens=0, lost_tokens=1100, break_context=orjson.dumps(CONTEXT).decode(),
                **broke,
            ),
            record(
                "r4", tenant_id=b, started_at=at(11, 0), usage=Usage(600, 512, 0, 10),
                upstream="http://r2", break_tokens=512, lost_tokens=300, break_early=False,
            ),
        ],
    )  # fmt: skip
    counters = {"prefix_cache_queries": 3300, "prefix_cache_hits": 0, "generation_tokens": 30}
    insert_samples(
        engine,
        [
            {
                "upstream": "http://r1",
                "sampler": "s",
                "sampled_at": at(9, 59, 59),
                **dict.fromkeys(("prefix_cache_queries", "prefix_cache_hits"), 0),
                "prompt_tokens": 0,
                "generation_tokens": 0,
            },
            {"upstream": "http://r1", "sampler": "s", "sampled_at": at(10, 30), **counters,
             "prompt_tokens": 3300},
        ],
    )  # fmt: skip
    yield database_url
    engine.dispose()


def test_breakers_are_ranked_with_their_cost_beside_the_saving_and_replicas_reconciled(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(url, monkeypatch, page="breakers")
    shown = {m.label: m.value for m in app.metric}
    per_token = (JUL.input - JUL.cache_read) / 1_000_000  # 0.135 per million
    assert shown["Lost to prefix breaks"] == formatting.money(2400 * per_token, "USD")
    assert shown["Lost to prefix breaks"] == "USD 0.000324"
    # r4 read 512 tokens from cache: (0.15 - 0.015) per million each.
    assert shown["Saved by the cache"] == formatting.money(512 * per_token, "USD")
    ranked = app.dataframe[0].value.to_dict("records")
    assert [
        (r["tenant"], r["break at token"], r["early"], r["requests"], r["tokens lost"], r["lost"])
        for r in ranked
    ] == [
        ("acme", 0, True, 2, 2100, formatting.money(Decimal(2100) * per_token, "USD")),
        ("bravo", 512, False, 1, 300, formatting.money(Decimal(300) * per_token, "USD")),
    ]
    assert ranked[0]["what changed"] == "…<|system|>\n2026-07-01T10:0⟨1 → 2⟩"
    [window] = app.dataframe[1].value.to_dict("records")
    assert (window["replica"], window["requests"], window["prompt recorded"]) == (
        "http://r1",
        3,
        3300,
    )
    assert (window["prompt counted"], window["prompt drift"], window["apart"]) == (
        3300,
        "0.0 %",
        "within 1 %",
    )
    assert not app.warning


def test_the_page_on_an_empty_database_says_what_to_do(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(database_url, monkeypatch, page="breakers")
    assert "No traffic yet. Point an OpenAI client at the gateway" in app.info[0].value
    assert not app.metric
