"""The Tenants page's budgets table and refusals chart under AppTest, on both databases.

Budgets are set and their counters charged for the period holding now (the page shows
each budget's current period); refusals are records in the test world's two days.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import access, budgets
from gateway.accounting.records import Record, Status
from gateway.accounting.store import insert_records
from gateway.budgets import DEFAULT_ALERTS, Budget, Period, parse_scope
from gateway.db import spend
from gateway.db.session import make_engine, transaction
from gateway.usage import Usage
from tests.dashboard.conftest import APP, FIRST_DAY, LAST_DAY, World, at, open_app
from tests.dashboard.test_pages import all_columns, chart_values, charts, shown_table, texts
from tests.factories import record

D = Decimal
BUDGET = "budget bud_x on tenant:acme (month) cannot cover this request: limit 10; it resets"
RATE = "rate limit of key:key_x reached for this minute; retry in 17 s"


def _set(world: World, scope: str, limit: str, period: Period) -> Budget:
    with transaction(world.sessions) as session:
        return spend.set_budget(
            session,
            scope=parse_scope(scope),
            limit=D(limit),
            period=period,
            alert_at=DEFAULT_ALERTS,
        )


def _charge(world: World, budget: Budget, amount: str, subject: str = "") -> None:
    start, _ = budget.bounds(datetime.now(UTC))
    charge = spend.Charge(budget.id, subject, start, budget.limit, D(amount))
    with transaction(world.sessions) as session:
        assert spend.reserve(session, [charge]) is None
        spend.settle(session, [charge], D(amount))


def refusal(n: int, tenant: str, started: datetime, error: str) -> Record:
    return record(
        f"ref_{n}",
        tenant_id=tenant,
        usage=Usage.missing(),
        prices=None,
        started_at=started,
        status=Status.REFUSED,
        error=error,
    )


@pytest.fixture
def budgeted(world: World) -> World:
    month = _set(world, "tenant:acme", "10", Period.MONTH)
    _charge(world, month, "2.5")
    alice = _set(world, "user:acme/alice", "1", Period.TOTAL)
    _charge(world, alice, "1")
    each = _set(world, "interaction:acme", "5", Period.TOTAL)
    _charge(world, each, "0.5", "i1")
    _charge(world, each, "1.25", "i2")
    _set(world, "tenant:bravo", "3", Period.WEEK)
    engine = make_engine(world.url)
    insert_records(
        engine,
        [
            refusal(1, world.a, at(30, 11, 5), BUDGET),
            refusal(2, world.a, at(30, 11, 40), BUDGET),
            refusal(3, world.a, at(1, 2, 0), RATE),
            refusal(4, world.b, at(1, 3, 0), BUDGET),
        ],
    )
    engine.dispose()
    return world


def table(app: AppTest) -> dict[str, dict[str, str]]:
    """The budgets table's rows, every column (the page shows the key ones, the rest
    under "All columns")."""
    assert list(shown_table(app, "runs out").columns) == list(budgets.COLUMNS)
    rows = all_columns(app, "runs out").to_dict("records")
    return {f"{r['tenant']} {r['scope']}": r for r in rows}


def refused(app: AppTest) -> dict[tuple[str, str], float]:
    [chart] = [c for c in charts(app) if "Refusals" in str(json.loads(c.proto.spec)["title"])]
    assert json.loads(chart.proto.spec)["title"] == "Refusals per hour"
    return {(v["at"], v["series"]): v["value"] for v in chart_values(chart) if v["value"]}


def test_the_tenants_page_shows_every_budget_and_the_refusals(
    budgeted: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(budgeted.url, monkeypatch, page="tenants")
    shown = table(app)
    assert list(shown) == [
        "acme interaction:acme",
        "acme tenant:acme",
        "acme user:acme/alice",
        "bravo tenant:bravo",
    ]
    month = shown["acme tenant:acme"]
    assert {k: month[k] for k in ("period", "limit", "spent", "reserved", "remaining")} == {
        "period": "month",
        "limit": "USD 10.00",
        "spent": "USD 2.50",
        "reserved": "USD 0.00",
        "remaining": "USD 7.50",
    }
    now = datetime.now(UTC)
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    assert month["period start"] == first.strftime("%Y-%m-%d 00:00")
    alice = shown["acme user:acme/alice"]
    assert (alice["spent"], alice["remaining"], alice["runs out"], alice["resets"]) == (
        "USD 1.00",
        "USD 0.00",
        "exhausted",
        "never (total)",
    )
    each = shown["acme interaction:acme"]
    assert (each["spent"], each["remaining"], each["runs out"]) == (
        "largest USD 1.25 (2 interactions)",
        "–",
        "per interaction",
    )
    assert shown["bravo tenant:bravo"]["runs out"] == "no spend yet"
    assert "Burn rate: spend per day over the period so far" in texts(app, "caption")
    assert refused(app) == {
        ("2026-06-30T11:00:00Z", "budget (402)"): 2,
        ("2026-07-01T02:00:00Z", "rate limit (429)"): 1,
        ("2026-07-01T03:00:00Z", "budget (402)"): 1,
    }


def test_a_tenant_signed_in_sees_only_its_own_budgets_and_refusals(
    budgeted: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVGATE_DATABASE_URL", budgeted.url)
    monkeypatch.setenv("KVGATE_DASHBOARD_PASSWORD", "s3cret-dashboard")
    app = AppTest.from_file(str(APP), default_timeout=30)
    app.session_state[access.KEY] = access.Viewer(tenant_id=budgeted.b)
    app.run()
    app.date_input(key="period").set_value((FIRST_DAY, LAST_DAY)).run()
    app.switch_page("screens/tenants.py").run()
    assert not app.exception, app.exception
    assert list(table(app)) == ["bravo tenant:bravo"]
    assert refused(app) == {("2026-07-01T03:00:00Z", "budget (402)"): 1}


def test_without_budgets_the_page_says_how_to_set_one(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch, page="tenants")
    assert budgets.NO_BUDGETS in texts(app, "info")
    assert not [d for d in app.dataframe if "runs out" in d.value.columns]
    assert "No request was refused at admission in this period." in texts(app, "caption")
