"""The dashboard's routing efficiency: within 100 %, and saying when its ceiling is approximate.

Two models routed on June 30: "m" by a router with the replicas' tokenizer (exact), "text"
by one without (approximate), whose ceilings fell short of what its replicas then served.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal

import pytest

from dashboard import formatting
from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record
from gateway.db import crud
from gateway.db.session import make_engine, session_factory, transaction
from gateway.usage import Usage
from tests.dashboard.conftest import JAN, World, at, make, open_app
from tests.dashboard.test_pages import all_columns, notes


def routed(
    n: int, tenant: str, usage: Usage, *, model: str, predicted: int, ceiling: int, exact: bool
) -> Record:
    record = make(
        n,
        tenant,
        at(30, 10, n),
        usage,
        interaction=f"i{n}",
        model=model,
        predicted=predicted,
        ceiling=ceiling,
        ttft_ms=100,
        upstream=f"http://{model}",
    )
    return replace(record, ceiling_exact=exact)


def exact_records(tenant: str) -> list[Record]:
    return [
        routed(1, tenant, Usage(496, 0, 0, 8), model="m", predicted=0, ceiling=0, exact=True),
        routed(2, tenant, Usage(18, 496, 0, 8), model="m", predicted=496, ceiling=496, exact=True),
    ]


def text_records(tenant: str) -> list[Record]:
    """Estimated ceilings 480 and 16 where the replica read 496 and 64, and 48 where it read
    nothing: 560 read of 544 (102.9 %) with the router's ceilings, of 608 stored."""
    return [
        routed(
            3, tenant, Usage(20, 496, 0, 8), model="text", predicted=480, ceiling=480, exact=False
        ),
        routed(4, tenant, Usage(10, 64, 0, 8), model="text", predicted=16, ceiling=16, exact=False),
        routed(5, tenant, Usage(600, 0, 0, 8), model="text", predicted=0, ceiling=48, exact=False),
    ]


def populate(url: str, records: list[Record]) -> None:
    engine = make_engine(url)
    insert_records(engine, records)
    engine.dispose()


@pytest.fixture
def tenant(database_url: str) -> Iterator[World]:
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    with transaction(sessions) as session:
        crud.add_prices(session, prices=[JAN])
        a = crud.create_tenant(session, name="acme").id
    yield World(database_url, sessions, a, "", [])
    engine.dispose()


def efficiency_tile(app: object) -> object:
    return next(m for m in app.metric if m.label == "Routing efficiency")  # type: ignore[attr-defined]


def test_an_exact_ceiling_is_shown_as_it_is(tenant: World, monkeypatch: pytest.MonkeyPatch) -> None:
    populate(tenant.url, exact_records(tenant.a))
    app = open_app(tenant.url, monkeypatch)
    tile = efficiency_tile(app)
    assert tile.value == formatting.percent(Decimal(1))  # type: ignore[attr-defined]
    assert not tile.delta  # type: ignore[attr-defined]
    assert "Routing efficiency" not in notes(app)
    assert "approximate" not in tile.help  # type: ignore[attr-defined]
    routing = open_app(tenant.url, monkeypatch, page="routing")
    rows = routing.dataframe[0].value.to_dict("records")
    assert [(r["model"], r["ceiling"], r["routing efficiency"]) for r in rows] == [
        ("m", "exact", "100.0 %")
    ]
    assert not any("pproximate" in str(c.value) for c in routing.caption)


def test_an_approximate_ceiling_says_so_and_efficiency_stays_within_100_percent(
    tenant: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    populate(tenant.url, [*exact_records(tenant.a), *text_records(tenant.a)])
    app = open_app(tenant.url, monkeypatch)
    tile = efficiency_tile(app)
    # Stored ceilings: 0 + 496 exact; 496 + 64 (raised to what the replicas read) + 48.
    expected = Decimal(496 + 496 + 64) / (496 + 496 + 64 + 48)
    assert tile.value == formatting.percent(expected)  # type: ignore[attr-defined]
    assert notes(app)["Routing efficiency"] == "partly approximate ceiling"
    assert "approximate for 3 of 5 requests" in tile.help  # type: ignore[attr-defined]
    assert any("approximate for 3 of 5" in str(c.value) for c in app.caption)

    routing = open_app(tenant.url, monkeypatch, page="routing")
    rows = {r["model"]: r for r in routing.dataframe[0].value.to_dict("records")}
    assert rows["text"]["ceiling"] == "approximate"
    assert rows["text"]["routing efficiency"] == formatting.percent(Decimal(560) / 608)
    assert rows["m"]["ceiling"] == "exact"
    captions = "\n".join(str(c.value) for c in routing.caption)
    assert "Approximate ceilings and predictions for text: the router had no tokenizer" in captions
    assert "Part of this ceiling is approximate" in captions

    only_text = open_app(tenant.url, monkeypatch)
    only_text.multiselect(key="models").set_value(["text"]).run()
    assert notes(only_text)["Routing efficiency"] == "approximate ceiling"

    tenants = open_app(tenant.url, monkeypatch, page="tenants")
    (row,) = all_columns(tenants, "ceiling").to_dict("records")
    assert (row["ceiling"], row["routing efficiency"]) == (
        "partly approximate",
        formatting.percent(expected),
    )
