"""Each tile against the previous period: the change as its delta, the old value in its help.

The known world's period is 2026-06-30..07-01 (two days), so the previous period is
2026-06-28..06-29, priced by JAN (input 0.20, cache read 0.02, output 0.60 per 1M). Its
records, and the figures they make, by hand:

    p1  acme  Usage(1000, 1000, 0, 100) warm 300 ms, ceiling 1500   0.00028  (saves 0.00018)
    p2  acme  Usage(400, 0, 0, 10) failed, attempt 1 of "p2"         0.000086
    p3  acme  Usage(400, 0, 0, 10) completed, attempt 2, cold 150 ms 0.000086
    p4  bravo refused by its budget                                  0
    p5  bravo Usage(10000, 0, 0, 0) cold 1000 ms                     0.002

    spend 0.002452; 3 completed interactions, 0.002452 / 3 = 0.000817333 each;
    hit rate 1000 / 12800; ceiling 1500 / 2000; efficiency 1000 / 1500;
    lost 500 x 0.18 / 1M = 0.00009; failure rate 1 / 4 (p4 is neither), failed 0.000086.

The current period gets one refusal too (bravo's rate limit): 1 failure in 7 admitted
attempts, where counting it would make 2 in 8.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from streamlit.proto.Metric_pb2 import Metric as MetricProto
from streamlit.testing.v1 import AppTest

from dashboard import formatting
from dashboard.view import View
from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.db.session import make_engine, session_factory
from gateway.usage import Usage
from tests.dashboard.conftest import World, at, make, open_app, world_records
from tests.factories import JAN, JUL, tenants

D = Decimal
PREVIOUS = "Previous period (2026-06-28 to 2026-06-29): "


def june(day: int, hour: int, second: int = 0) -> datetime:
    return datetime(2026, 6, day, hour, 0, second, tzinfo=UTC)


def previous_records(a: str, b: str) -> list[Record]:
    """The period before the world's: see the module's docstring."""
    return [
        make(101, a, june(28, 10), Usage(1000, 1000, 0, 100), interaction="p1", ttft_ms=300,
             ceiling=1500, predicted=1000),
        make(102, a, june(29, 9), Usage(400, 0, 0, 10), interaction="p2", status=Status.FAILED,
             error="upstream 503"),
        make(103, a, june(29, 9, 2), Usage(400, 0, 0, 10), interaction="p2", attempt=2,
             ttft_ms=150),
        refused(104, b, june(29, 11), "budget tenant:bravo exhausted"),
        make(105, b, june(28, 12), Usage(10_000, 0, 0, 0), interaction="p5", ttft_ms=1000),
    ]  # fmt: skip


def refused(n: int, tenant: str, started: datetime, error: str) -> Record:
    """A request turned away at admission: no upstream, no usage, no price, no cost."""
    return make(
        n, tenant, started, Usage.missing(), interaction=f"r{n}", status=Status.REFUSED,
        upstream="", error=error, prices=None,
    )  # fmt: skip


@pytest.fixture
def two_periods(database_url: str) -> Iterator[World]:
    engine = make_engine(database_url)
    made = tenants(engine, "acme", "bravo", prices=[JAN, JUL])
    a, b = made["acme"].id, made["bravo"].id
    records = [
        *world_records(a, b),
        refused(8, b, at(1, 3), "rate limit 10 requests / minute"),
        *previous_records(a, b),
    ]
    insert_records(engine, records)
    yield World(database_url, session_factory(engine), a, b, records)
    engine.dispose()


def tiles(app: AppTest) -> dict[str, tuple[str, str, str, str]]:
    """Each tile: its value, its delta, the delta's colour and its help's last line."""
    return {
        m.label: (
            m.value,
            m.proto.delta,
            MetricProto.MetricColor.Name(m.proto.color) if m.proto.delta else "",
            m.help.rsplit("\n\n", 1)[-1],
        )
        for m in app.metric
    }


def edge(millis: float) -> float:
    """The upper edge of the TTFT bucket holding ``millis``."""
    return 2 ** ((math.floor(8 * math.log2(millis)) + 1) / 8)


def test_every_tile_shows_the_change_since_the_previous_period(
    two_periods: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(two_periods.url, monkeypatch)
    shown = tiles(app)
    # The world's figures (test_pages computes them from its records) against June's.
    now_hit, before_hit = D(800 + 777 + 900) / 1_004_617, D(1000) / 12_800
    now_ceiling, now_efficiency = D(900 + 1000 + 950) / 3110, D(2477) / 2850
    now_lost = (D(100) * D("0.18") + D(223 + 50) * D("0.135")) / 10**6
    assert shown["Spend"] == (
        "USD 0.150974155",
        "+USD 0.148522155",
        "GRAY",
        PREVIOUS + "USD 0.002452.",
    )
    assert shown["Completed interactions"] == ("5", "+2", "GREEN", PREVIOUS + "3.")
    # 0.150974155 / 4 priced interactions (i5 is an unpriced model's) = 0.037743539.
    assert shown["Cost per completed interaction"] == (
        "USD 0.037743539",
        "+USD 0.036926206",
        "RED",
        PREVIOUS + "USD 0.000817333.",
    )
    assert shown["Token hit rate"] == (
        "0.2 %",
        formatting.points(now_hit - before_hit),
        "RED",
        PREVIOUS + "7.8 %.",
    )
    assert formatting.points(now_hit - before_hit) == "-7.6 pp"
    assert shown["Hit-rate ceiling"] == ("91.6 %", "+16.6 pp", "GRAY", PREVIOUS + "75.0 %.")
    assert formatting.points(now_ceiling - D("0.75")) == "+16.6 pp"
    assert shown["Routing efficiency"] == (
        "86.9 %",
        formatting.points(now_efficiency - D(2) / 3),
        "GREEN",
        PREVIOUS + "66.7 %.",
    )
    assert formatting.points(now_efficiency - D(2) / 3) == "+20.2 pp"
    # Missed: 100 (req_2, JAN: 0.18 a token), 223 + 50 (req_4, req_7, JUL: 0.135) per 1M.
    assert now_lost == D("0.000054855")
    assert shown["Lost to avoidable misses"] == (
        "USD 0.000054855",
        "-USD 0.000035145",
        "GREEN",
        PREVIOUS + "USD 0.00009.",
    )
    # Cache reads: 800 x 0.18 (req_2), 777 x 0.135 (req_4), 900 x 0.135 (req_7) per 1M.
    assert shown["Saved by the cache"] == (
        "USD 0.000370395",
        "+USD 0.000190395",
        "GREEN",
        PREVIOUS + "USD 0.00018.",
    )
    # The refusal of either period counts on neither side: 1 / 7 now, 1 / 4 before.
    assert shown["Failure rate"] == ("14.3 %", "-10.7 pp", "GREEN", PREVIOUS + "25.0 %.")
    # req_3: 500 x 0.15 + 10 x 0.45 per 1M, against p2's 400 x 0.20 + 10 x 0.60.
    assert shown["Spend on failed or retried attempts"] == (
        "USD 0.0000795",
        "-USD 0.0000065",
        "GREEN",
        PREVIOUS + "USD 0.000086.",
    )
    failure = next(m for m in app.metric if m.label == "Failure rate")
    assert "1 of 7" in failure.help and "not failures" in failure.help
    assert "(1 in the period)" in failure.help
    # Cold: 400, 800, 2000 ms now, 150 and 1000 before; warm: 90, 100, 120 against 300.
    assert shown["TTFT cold p50"] == (
        formatting.millis(edge(800)),
        formatting.millis_change(edge(800) - edge(150)),
        "RED",
        PREVIOUS + formatting.millis(edge(150)) + ".",
    )
    assert shown["TTFT warm p50"] == (
        formatting.millis(edge(100)),
        formatting.millis_change(edge(100) - edge(300)),
        "GREEN",
        PREVIOUS + formatting.millis(edge(300)) + ".",
    )
    assert formatting.millis_change(edge(100) - edge(300)) == "-197 ms"
    assert {m.proto.delta_description for m in app.metric} == {"vs previous 2 days"}


def test_without_traffic_in_the_previous_period_no_tile_shows_a_change(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(world.url, monkeypatch)
    assert app.metric
    for tile in app.metric:
        assert not tile.proto.delta and not tile.proto.delta_description, tile.label
        assert tile.help.endswith(
            "\n\nNo traffic in the previous period (2026-06-28 to 2026-06-29)."
        ), tile.label


def test_a_period_after_the_traffic_compares_with_nothing_but_says_what_was_before(
    two_periods: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """June 28..29 (before: June 26..27, empty) has the previous records alone."""
    app = open_app(two_periods.url, monkeypatch, start=june(28, 0).date(), end=june(29, 0).date())
    shown = tiles(app)
    assert shown["Spend"] == (
        "USD 0.002452",
        "",
        "",
        "No traffic in the previous period (2026-06-26 to 2026-06-27).",
    )
    assert shown["Failure rate"][0] == "25.0 %"  # p2 of p1, p2, p3, p5: p4 was refused


def test_changes_read_signed_first_and_a_small_change_never_reads_as_none() -> None:
    assert formatting.points(D("0.0123")) == "+1.2 pp"
    assert formatting.points(D("-0.0000004")) == "-0.00004 pp"
    assert formatting.points(D(0)) == "0.0 pp"
    assert formatting.money_change(D("-0.0000065"), "USD") == "-USD 0.0000065"
    assert formatting.money_change(D(0), "USD") == "USD 0.00"
    assert formatting.count_change(-1204) == "-1,204"
    assert formatting.millis_change(3.46) == "+3.5 ms"


def test_the_previous_period_is_as_many_days_just_before() -> None:
    view = View(ZoneInfo("Asia/Tokyo"), june(24, 0).date(), june(30, 0).date(), ("t",), ("m",))
    before = view.previous()
    assert (before.start, before.end, before.days) == (june(17, 0).date(), june(23, 0).date(), 7)
    assert (before.zone, before.tenant_ids, before.models) == (view.zone, ("t",), ("m",))
    assert before.upper == view.lower
