"""The Models and prices page's "Cost to serve": per deployment × tenant, cost to serve,
charged, margin and cache saving, idle hours on a line of their own, with the formula in
its caption; shown to operators, never to a signed-in tenant."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import access, formatting
from gateway.db import crud
from gateway.db.session import make_engine, session_factory
from tests.dashboard.conftest import APP, open_app
from tests.dashboard.test_sign_in import PASSWORD, shown
from tests.support.serving import serving_world

D = Decimal
JUL1 = date(2026, 7, 1)


@pytest.fixture
def world(database_url: str) -> Iterator[tuple[Any, dict[str, str]]]:
    engine = make_engine(database_url)
    ids = serving_world(engine)
    yield session_factory(engine), ids
    engine.dispose()


@pytest.fixture(autouse=True)
def fresh_throttle() -> Iterator[None]:
    access.throttle.clear()
    yield
    access.throttle.clear()


def money(amount: Decimal | None) -> str:
    """Money as the dashboard writes it (tables, tiles and hovers alike)."""
    return formatting.money(amount, "USD")


def serving_frames(app: AppTest) -> list[Any]:
    return [frame for frame in app.dataframe if "cost to serve" in frame.value.columns]


def serving_table(app: AppTest) -> list[dict[str, Any]]:
    [table] = serving_frames(app)
    return [
        {name: None if value is None or value != value else value for name, value in row.items()}
        for row in table.value.to_dict("records")
    ]


def test_operators_see_cost_to_serve_per_deployment_and_tenant_and_the_idle_hours(
    world: tuple[Any, dict[str, str]], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(database_url, monkeypatch, page="models", start=JUL1, end=JUL1)
    assert "Cost to serve" in [h.value for h in app.header]
    # The day's hours from the first entry (10:00) on: tests/support/serving.py's 10:00 to
    # 13:00, then r6 at 13:00 (a's alone: 3.00; charged 9 × 0.15 + 9 × 0.45 per 1M =
    # 0.0000054), and 14:00 to 23:00 idle at 3.00: idle 11:00 (5.00) + 10 × 3.00 = 35.
    assert serving_table(app) == [
        {
            "deployment": "m",
            "tenant": "a",
            "hours": 3,
            "cost to serve": money(D("7.985148515")),
            "charged": money(D("0.000261150")),
            "margin": money(D("-7.984887365")),
            "cache saving": money(D("8.242574257")),
        },
        {
            "deployment": "m",
            "tenant": "b",
            "hours": 2,
            "cost to serve": money(D("3.014851485")),
            "charged": money(D("0.000101700")),
            "margin": money(D("-3.014749785")),
            "cache saving": money(D("0.000000000")),
        },
        {
            "deployment": "m",
            "tenant": "(idle)",
            "hours": 11,
            "cost to serve": money(D("35.000000000")),
            "charged": "nothing (idle)",  # not an empty cell
            "margin": money(D("-35.000000000")),
            "cache saving": "nothing (idle)",
        },
    ]
    caption = " ".join(c.value for c in app.caption)
    assert "uncached prompt tokens + R × output tokens" in caption
    assert "Cache saving = hour cost × cache-read tokens / the hour's work" in caption


def test_without_gpu_costs_the_section_says_how_to_set_one(
    empty_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(empty_world.url, monkeypatch, page="models")
    assert "No GPU costs yet: `kvgate gpu-cost set" in " ".join(i.value for i in app.info)


def test_a_signed_in_tenant_sees_no_cost_to_serve(
    world: tuple[Any, dict[str, str]], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, ids = world
    with sessions() as session, session.begin():
        issued = crud.create_key(session, tenant_name="a")
    monkeypatch.setenv("KVGATE_DATABASE_URL", database_url)
    monkeypatch.setenv("KVGATE_DASHBOARD_PASSWORD", PASSWORD)
    app = AppTest.from_file(str(APP), default_timeout=30).run()
    app.text_input(key=access.API_KEY).set_value(issued.key)
    app.button[0].click().run()
    app.date_input(key="period").set_value((JUL1, JUL1)).run()
    app.switch_page("screens/models.py").run()
    assert not app.exception, app.exception
    assert app.title[0].value == "Models and prices"
    assert "Cost to serve" not in [h.value for h in app.header]
    assert not serving_frames(app)
    drawn = shown(app)
    assert ids["b"].encode() not in drawn and b"3.014851485" not in drawn
