"""Every page under Streamlit's AppTest, with data and on an empty database.

Expected figures are computed here from the records the test inserted (exact Decimals),
then put through the dashboard's formatting, which is the only rounding there is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from typing import Any

import pyarrow.ipc
import pytest
from streamlit.runtime.media_file_manager import MediaFileManager
from streamlit.runtime.media_file_storage import MediaFileStorage
from streamlit.testing.v1 import AppTest

from dashboard import formatting
from gateway import billing
from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record
from gateway.db import crud
from gateway.db.session import make_engine
from gateway.usage import Usage
from pricing.cost import NANO, PER_MILLION
from tests.dashboard.conftest import World, at, make, open_app
from tests.factories import BOOK, JAN, JUL

D = Decimal


def metrics(app: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in app.metric}


def deltas(app: AppTest) -> dict[str, str]:
    """The change since the previous period on each tile that shows one."""
    return {m.label: m.proto.delta for m in app.metric if m.proto.delta}


def notes(app: AppTest) -> dict[str, str]:
    """The note under each tile that has one: a caption in the tile's column."""
    found = {}
    for column in app.columns:
        if len(column.metric) == 1 and column.caption:
            found[column.metric[0].label] = str(column.caption[0].value)
    return found


def nodes(node: Any) -> Iterator[Any]:
    yield node
    for child in getattr(node, "children", {}).values():
        yield from nodes(child)


def charts(app: AppTest) -> list[Any]:
    """The page's Vega-Lite charts."""
    return [n for n in nodes(app.main) if getattr(n, "type", "") == "vega_lite_chart"]


def chart_values(chart: Any) -> list[dict[str, Any]]:
    """A chart's data points: Streamlit sends them as Arrow tables beside the spec."""
    tables = [dataset.data.data for dataset in chart.proto.datasets]
    if chart.proto.data.data:
        tables.append(chart.proto.data.data)
    return [
        row for table in tables for row in pyarrow.ipc.open_stream(table).read_all().to_pylist()
    ]


def shown_table(app: AppTest, column: str) -> Any:
    """The page's table (its key columns) that has ``column``, as a DataFrame."""
    hidden = {id(d.proto) for e in app.expander for d in e.dataframe}
    return next(
        d.value for d in app.dataframe if id(d.proto) not in hidden and column in d.value.columns
    )


def all_columns(app: AppTest, column: str) -> Any:
    """The whole table under "All columns" that has ``column``, as a DataFrame."""
    return next(
        d.value
        for e in app.expander
        if e.label == "All columns"
        for d in e.dataframe
        if column in d.value.columns
    )


def texts(app: AppTest, kind: str) -> str:
    return "\n".join(str(element.value) for element in getattr(app, kind))


def ttft_edge(millis: float) -> str:
    """What the dashboard shows for a TTFT: the upper edge of its 1/8-doubling bucket."""
    return formatting.millis(2 ** ((math.floor(8 * math.log2(millis)) + 1) / 8))


def expected(records: list[Record]) -> dict[str, str]:
    """The overview's headline figures, from the records alone."""
    total = sum((r.cost.total for r in records), D(0))
    equivalent = sum((r.cost.uncached_equivalent for r in records), D(0))
    failed = sum((r.cost.total for r in records if r.status != "completed"), D(0))
    completed = len({(r.tenant_id, r.interaction_id) for r in records if r.status == "completed"})
    # Cost per completed interaction is over interactions a priced attempt completed.
    priced = len(
        {(r.tenant_id, r.interaction_id) for r in records if r.status == "completed" and r.priced}
    )
    prompt = sum(r.usage.prompt_tokens for r in records)
    read = sum(r.usage.cache_read_tokens for r in records)
    routed = [r for r in records if r.ceiling_cached_tokens is not None]
    avoidable = D(0)
    for r in routed:
        price = BOOK.price_for(r.model, at=r.started_at)
        assert price is not None and r.ceiling_cached_tokens is not None
        missed = max(r.ceiling_cached_tokens - r.usage.cache_read_tokens, 0)
        avoidable += missed * (price.input - price.cache_read) / PER_MILLION
    return {
        "Spend": formatting.money(total, "USD"),
        "Completed interactions": f"{completed:,}",
        "Cost per completed interaction": formatting.money((total / priced).quantize(NANO), "USD"),
        "Failure rate": formatting.percent(
            D(sum(1 for r in records if r.status != "completed")) / len(records)
        ),
        "Spend on failed or retried attempts": formatting.money(failed, "USD"),
        "Hit-rate ceiling": formatting.percent(
            D(sum(r.ceiling_cached_tokens or 0 for r in routed))
            / sum(r.usage.prompt_tokens for r in routed)
        ),
        "Token hit rate": formatting.percent(D(read) / prompt),
        "Routing efficiency": formatting.percent(
            D(sum(r.usage.cache_read_tokens for r in routed))
            / sum(r.ceiling_cached_tokens or 0 for r in routed)
        ),
        "Saved by the cache": formatting.money(equivalent - total, "USD"),
        "Lost to avoidable misses": formatting.money(avoidable, "USD"),
    }


def test_overview_figures_equal_those_computed_from_the_records(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch)
    shown = metrics(app)
    assert {k: shown[k] for k in expected(world.records)} == expected(world.records)
    assert shown["Spend"] == "USD 0.150974155"  # 0.000974155 (acme) + 0.15 (bravo)
    assert shown["Completed interactions"] == "5"
    # Cold: 400, 800, 2000 ms; warm: 90, 100, 120 ms (nearest rank, bucket upper edges).
    under = notes(app)
    assert [shown["TTFT cold p50"], under["TTFT cold p50"]] == [
        ttft_edge(800),
        f"p90 {ttft_edge(2000)}",
    ]
    assert [shown["TTFT warm p50"], under["TTFT warm p50"]] == [
        ttft_edge(100),
        f"p90 {ttft_edge(120)}",
    ]
    drawn = charts(app)
    assert len(drawn) == 4
    assert json.loads(drawn[0].proto.spec)["title"] == "Spend and cache value per hour (USD)"
    spend = [v for v in chart_values(drawn[0]) if v["series"] == "spend"]
    # Hourly buckets over two days; the 00:00 UTC bucket of July 1 holds 3, 4 and 6.
    july_first = next(v for v in spend if v["at"] == "2026-07-01T00:00:00Z")
    assert D(str(july_first["value"])) == sum(
        (r.cost.total for r in world.records[2:4] + world.records[5:6]), D(0)
    )
    # The hover shows the exact amount: drawn at six places, 0.0000004 would read as 0.
    june_first = next(v for v in spend if v["at"] == "2026-06-30T10:00:00Z")
    assert june_first["text"] == formatting.money(
        world.records[0].cost.total + world.records[1].cost.total, "USD"
    )
    tooltip = json.loads(drawn[0].proto.spec)["encoding"]["tooltip"]
    assert {"field": "text", "title": "value", "type": "nominal"} in tooltip


def test_unpriced_attempts_are_left_out_of_cost_per_interaction_and_said_beside_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """i5 (an unpriced model) is 1 of 5 completed interactions: the cost of the priced
    attempts is divided by the other 4, and the share left out is shown with it."""
    app = open_app(world.url, monkeypatch)
    priced_cost = sum((r.cost.total for r in world.records if r.priced), D(0))
    assert metrics(app)["Cost per completed interaction"] == formatting.money(
        (priced_cost / 4).quantize(NANO), "USD"
    )
    assert notes(app) == {
        "Spend": "+ 1 unpriced attempt, cost unknown",
        "Cost per completed interaction": "20.0 % of interactions unpriced",
        # The world's ceilings carry no kind (as rows recorded before kvgate kept one).
        "Hit-rate ceiling": "approximate ceiling",
        "Routing efficiency": "approximate ceiling",
        "Spend on failed or retried attempts": formatting.percent(
            sum((r.cost.total for r in world.records if r.status != "completed"), D(0))
            / sum((r.cost.total for r in world.records), D(0))
        )
        + " of spend",
        "TTFT cold p50": f"p90 {ttft_edge(2000)}",
        "TTFT warm p50": f"p90 {ttft_edge(120)}",
    }


def test_only_unpriced_traffic_shows_no_spend_and_no_currency(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch)
    app.multiselect(key="models").set_value(["unpriced"]).run()
    shown = metrics(app)
    assert shown["Spend"] == shown["Cost per completed interaction"] == formatting.MISSING
    assert notes(app)["Cost per completed interaction"] == "100.0 % of interactions unpriced"
    assert not [value for value in shown.values() if "USD" in value]
    titles = [json.loads(chart.proto.spec).get("title") for chart in charts(app)]
    assert "Cost per completed interaction" in titles
    assert not [title for title in titles if "USD" in str(title)]


def test_overview_filters_by_tenant_and_model(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch)
    app.multiselect(key="tenants").set_value([world.a])
    app.multiselect(key="models").set_value(["m"]).run()
    chosen = [r for r in world.records if r.tenant_id == world.a and r.model == "m"]
    shown = metrics(app)
    assert {k: shown[k] for k in expected(chosen)} == expected(chosen)
    assert shown["Completed interactions"] == "3"  # i1, i2, conv


def test_overview_reads_days_in_the_viewers_zone(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """July 1 in Tokyo (UTC+9) is June 30 15:00 to July 1 15:00 UTC: records 3 to 7."""
    app = open_app(
        world.url, monkeypatch, zone="Asia/Tokyo", start=date(2026, 7, 1), end=date(2026, 7, 1)
    )
    assert metrics(app)["Spend"] == formatting.money(
        sum((r.cost.total for r in world.records[2:]), D(0)), "USD"
    )


def test_overview_without_traffic_in_the_period_says_where_traffic_is(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch, start=date(2026, 8, 1), end=date(2026, 8, 2))
    assert not app.metric
    assert "Traffic runs from 2026-06-30 10:00:00.000 to 2026-07-01 07:00:00.000" in texts(
        app, "info"
    )


@pytest.mark.parametrize("page", [None, "tenants", "models", "routing", "requests"])
def test_every_page_on_an_empty_database_says_what_to_do(
    empty_world: World, monkeypatch: pytest.MonkeyPatch, page: str | None
) -> None:
    app = open_app(empty_world.url, monkeypatch, page=page)
    shown = texts(app, "info")
    if page == "models":
        assert "No prices yet: `kvgate prices sync`" in shown
    else:
        assert "No traffic yet. Point an OpenAI client at the gateway" in shown
    if page == "tenants":
        assert "No tenants yet: `kvgate tenants create NAME`" in shown


@pytest.fixture
def media(monkeypatch: pytest.MonkeyPatch) -> list[MediaFileManager]:
    """The media managers AppTest creates: where download buttons keep their bytes."""
    managers: list[MediaFileManager] = []

    class Kept(MediaFileManager):
        def __init__(self, storage: MediaFileStorage) -> None:
            super().__init__(storage)
            managers.append(self)

    monkeypatch.setattr("streamlit.testing.v1.app_test.MediaFileManager", Kept)
    return managers


def download(app: AppTest, managers: list[MediaFileManager], key: str) -> bytes:
    """Click a deferred download button's data into being, as the browser's click does."""
    button = next(b for b in app.get("download_button") if b.proto.id.endswith(key))
    url = managers[-1].execute_deferred(button.proto.deferred_file_id)
    return bytes(managers[-1]._storage.get_file(url.rsplit("/", 1)[1]).content)


def test_tenants_table_and_statement_downloads_equal_the_billing_api(
    world: World, monkeypatch: pytest.MonkeyPatch, media: list[MediaFileManager]
) -> None:
    app = open_app(world.url, monkeypatch, page="tenants")
    table = {row["tenant"]: row for row in all_columns(app, "unpriced attempts").to_dict("records")}
    acme = [r for r in world.records if r.tenant_id == world.a]
    spend = sum((r.cost.total for r in acme), D(0))
    assert spend == D("0.000974155")
    assert table["acme"]["spend"] == "USD 0.000974155"
    assert table["acme"]["completed interactions"] == 4
    # Over the 3 a priced attempt completed: i5 (an unpriced model) is 1 of 4 left out.
    assert (spend / 3).quantize(NANO) == D("0.000324718")
    assert table["acme"]["cost per completed interaction"] == "USD 0.000324718"
    assert table["acme"]["unpriced interactions"] == formatting.percent(D("0.25")) == "25.0 %"
    assert table["acme"]["unpriced attempts"] == 1
    assert table["bravo"]["spend"] == "USD 0.15"
    # The page shows the key columns; the rest are under "All columns".
    main = shown_table(app, "completed interactions")
    assert list(main.columns) == [
        "tenant",
        "spend",
        "completed interactions",
        "cost per completed interaction",
        "token hit rate",
        "routing efficiency",
        "saved by cache",
    ]
    assert list(main["spend"]) == ["USD 0.15", "USD 0.000974155"]
    assert list(table) == ["bravo", "acme"]  # biggest spender first
    app.selectbox(key="tenant").set_value(world.a).run()
    with world.sessions() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name="acme"),
            start=date(2026, 6, 30),
            end=date(2026, 7, 1),
        )
    assert download(app, media, "statement_csv") == billing.render(statement, "csv")[0]
    assert download(app, media, "statement_json") == billing.render(statement, "json")[0]
    assert metrics(app)["Completed interactions"] == str(statement.totals.completed.interactions)
    assert metrics(app)["Cost per completed interaction"] == formatting.money(
        statement.totals.cost_per_completed_interaction, statement.currency
    )
    # The unpriced share beside it is the statement's: i5 of acme's 4 interactions.
    assert statement.totals.unpriced_interaction_share == D("0.25")
    assert notes(app)["Cost per completed interaction"] == "25.0 % of interactions unpriced"


def test_a_tenant_shows_its_top_end_users_and_tags_by_spend(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch, page="tenants")
    app.selectbox(key="tenant").set_value(world.a).run()
    tables = [
        t.value.to_dict("records")
        for t in app.dataframe
        if list(t.value.columns) == ["name", "requests", "spend"]
    ]
    cost = {r.request_id: r.cost.total for r in world.records}

    def ranked(*spenders: tuple[str, int, Decimal]) -> list[dict[str, Any]]:
        """Most spend first, as the page ranks them, with the page's money format."""
        order = sorted(spenders, key=lambda s: (-s[2], -s[1], s[0]))
        return [
            {"name": n, "requests": r, "spend": formatting.money(c, "USD")} for n, r, c in order
        ]

    assert tables == [
        # Acme's alice only: bravo's alice (req_6) is bravo's.
        ranked(("alice", 2, cost["req_1"] + cost["req_2"]), ("bob", 1, cost["req_4"])),
        ranked(
            ("team=search", 2, cost["req_1"] + cost["req_2"]),
            ("team=ads", 1, cost["req_4"]),
            ("env=prod", 1, cost["req_2"]),
        ),
    ]


def test_models_page_shows_the_price_book_paid_rates_and_unpriced_requests(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch, page="models")
    book = app.dataframe[0].value.to_dict("records")
    assert [(r["model"], r["input / 1M"], r["cache read / 1M"]) for r in book] == [
        ("m", "USD 0.20", "USD 0.02"),
        ("m", "USD 0.15", "USD 0.015"),
    ]
    paid = app.dataframe[1].value.to_dict("records")
    for row, price in zip(paid, (JAN, JUL), strict=True):
        under = [r for r in world.records if r.price_id == price.id]
        cost = sum((r.cost.uncached + r.cost.cache_read + r.cost.cache_write for r in under), D(0))
        prompt = sum(r.usage.prompt_tokens for r in under)
        assert row["list input / 1M"] == formatting.money(price.input, "USD")
        assert row["paid input / 1M"] == formatting.money(cost * PER_MILLION / prompt, "USD")
        assert row["prompt tokens"] == prompt
    # June: (1000 x 0.20 + 200 x 0.20 + 800 x 0.02) / 2000 tokens = 0.128 per 1M.
    assert paid[0]["paid input / 1M"] == "USD 0.128"
    assert "1 attempts in this period had no price entry" in texts(app, "warning")
    assert app.dataframe[2].value.to_dict("records") == [
        {"model": "unpriced", "attempts": 1, "prompt tokens": 7, "output tokens": 1}
    ]
    assert len(charts(app)) == 4  # input, cache-read and output rates; list vs paid


def test_routing_page_compares_predictions_and_ceilings_per_replica(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch, page="routing")
    rows = {(r["model"], r["replica"]): r for r in all_columns(app, "ceiling").to_dict("records")}
    r2 = [r for r in world.records if r.upstream == "http://r2"]
    assert rows[("m", "http://r2")]["attempts"] == 3
    assert rows[("m", "http://r2")]["failed"] == 1
    # A column with a gap is text throughout, counts with their separators.
    assert rows[("m", "http://r2")]["predicted cached tokens"] == "1,700"  # 800 + 900
    assert rows[("m", "http://r2")]["reported cached tokens (predicted requests)"] == "1,700"
    assert rows[("m", "http://r2")]["token hit rate"] == formatting.percent(
        D(sum(r.usage.cache_read_tokens for r in r2)) / sum(r.usage.prompt_tokens for r in r2)
    )
    unrouted = rows[("unpriced", "http://r1")]
    assert unrouted["predicted cached tokens"] == "no routing data yet"  # not an empty cell
    assert unrouted["routing efficiency"] == unrouted["ceiling"] == "no routing data yet"
    assert "No routing data yet" not in texts(app, "info")
    assert len(charts(app)) == 4


def test_routing_page_before_routing_records_anything_says_so(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(
        world.url, monkeypatch, page="routing", start=date(2026, 6, 30), end=date(2026, 6, 30)
    )
    assert "No routing data yet" not in texts(app, "info")  # record 2 carries a ceiling
    app.multiselect(key="models").set_value(["unpriced"])
    app.date_input(key="period").set_value((date(2026, 7, 1), date(2026, 7, 1))).run()
    assert texts(app, "info").count("No routing data yet") == 2


def test_requests_page_lists_filters_and_looks_up_every_attempt(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(
        world.url,
        monkeypatch,
        page="requests",
        zone="Asia/Tokyo",
        start=date(2026, 6, 30),
        end=date(2026, 7, 2),
    )
    latest = app.dataframe(key="recent").value.to_dict("records")
    assert [r["request id"] for r in latest] == [f"req_{n}" for n in (7, 5, 6, 4, 3, 2, 1)]
    assert latest[0]["started (Asia/Tokyo)"] == "2026-07-01 15:10:00.000"  # 06:10 UTC
    # 100 x 0.15 + 900 x 0.015 + 20 x 0.45 per 1M, shown whole: never rounded to 0.
    assert world.records[6].cost.total == D("0.0000375")
    assert latest[0]["cost total"] == "USD 0.0000375"
    unpriced = next(r for r in latest if r["request id"] == "req_5")
    assert unpriced["cost total"] == "unpriced"  # unknown, not 0
    everything = all_columns(app, "cost cache read").to_dict("records")
    assert everything[0]["cost cache read"] == "USD 0.0000135"
    assert "cost cache read" not in app.dataframe(key="recent").value.columns
    app.selectbox(key="req_status").set_value("failed").run()
    assert [r["request id"] for r in app.dataframe(key="recent").value.to_dict("records")] == [
        "req_3"
    ]
    app.text_input(key="lookup").set_value("req_7").run()
    attempts = app.dataframe(key="attempts").value.to_dict("records")
    assert [(r["request id"], r["attempt"], r["status"]) for r in attempts] == [
        ("req_3", 1, "failed"),
        ("req_4", 2, "completed"),
        ("req_7", 1, "completed"),
    ]
    conversation = world.records[2:4] + world.records[6:7]
    assert formatting.money(sum((r.cost.total for r in conversation), D(0)), "USD") in texts(
        app, "caption"
    )
    app.text_input(key="lookup").set_value("conv").run()
    assert len(app.dataframe(key="attempts").value) == 3
    app.text_input(key="lookup").set_value("nope").run()
    assert "No request or interaction 'nope'" in texts(app, "warning")


def test_models_page_splits_the_periods_traffic_by_endpoint(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every record of the world came in on chat; two more on Responses and embeddings."""
    extra = [
        make(
            90,
            world.a,
            at(1, 7, 0),
            Usage(300, 100, 0, 30),
            interaction="r90",
            endpoint="/v1/responses",
        ),
        make(
            91,
            world.b,
            at(1, 8, 0),
            Usage(64, 0, 0, 0),
            interaction="e91",
            endpoint="/v1/embeddings",
        ),
    ]
    insert_records(make_engine(world.url), extra)
    app = open_app(world.url, monkeypatch, page="models")
    table = app.dataframe[-1].value.to_dict("records")
    everything = [*world.records, *extra]

    def line(endpoint: str) -> dict[str, object]:
        mine = [r for r in everything if r.endpoint == endpoint and r.priced]
        return {
            "endpoint": endpoint,
            "attempts": len(mine),
            "prompt tokens": sum(r.usage.prompt_tokens for r in mine),
            "read from cache": sum(r.usage.cache_read_tokens for r in mine),
            "output tokens": sum(r.usage.output_tokens for r in mine),
            "cost": formatting.money(sum((r.cost.total for r in mine), D(0)), "USD"),
        }

    unpriced = [r for r in everything if not r.priced]
    assert table == [
        line("/v1/chat/completions"),
        line("/v1/responses"),
        line("/v1/embeddings"),
        {
            "endpoint": "/v1/chat/completions",
            "attempts": len(unpriced),
            "prompt tokens": 7,
            "read from cache": 0,
            "output tokens": 1,
            "cost": "unpriced",
        },
    ]
    assert table[1]["prompt tokens"] == 400 and table[2]["attempts"] == 1
