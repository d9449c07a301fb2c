"""The real thing: `kvgate dashboard` on loopback, opened in Debian's headless Chromium.

Needs `apt-get install -y chromium` (the test set-up does it); playwright only drives
that browser, it never downloads one. The screenshot is left in test-artifacts/.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.served import PASSWORD, PRODUCTION, TENANTS, Seeded, dashboard
from tests.dashboard.wire import PAGES, found

CHROMIUM = "/usr/bin/chromium"
WIDTH, HEIGHT = 1500, 1300  # the window
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium"),
]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Seeded]:
    """An open (development) dashboard on the seeded world."""
    with dashboard(tmp_path) as running:
        yield running


def test_the_overview_renders_its_figures_and_charts_in_chromium(served: Seeded) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard-overview.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            page.goto(served.url, wait_until="domcontentloaded")
            page.get_by_role("heading", name="Overview").wait_for(timeout=30_000)
            metrics = page.locator('[data-testid="stMetric"]')
            metrics.nth(11).wait_for(timeout=30_000)
            charts = page.locator(
                '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg.marks'
            )
            charts.nth(3).wait_for(timeout=30_000)
            page.wait_for_timeout(500)  # let the charts finish drawing for the screenshot
            page.screenshot(path=str(shot), full_page=True)
            text = page.locator('[data-testid="stMain"]').inner_text()
            sidebar = page.locator('[data-testid="stSidebar"]').inner_text()
        finally:
            browser.close()
    assert metrics is not None
    assert served.total_spend == "0.172992355"
    assert f"USD {served.total_spend}" in text  # spend: opens on the week up to the last traffic
    assert "Completed interactions" in text and "Routing efficiency" in text
    for page_name in ("Overview", "Tenants", "Models and prices", "Routing", "Requests"):
        assert page_name in sidebar
    assert shot.stat().st_size > 20_000
    assert shutil.which("chromium") or Path(CHROMIUM).exists()


def test_chromium_receives_no_page_data_before_sign_in(tmp_path: Path) -> None:
    """Every page's URL opened in Chromium before sign-in: the form alone, and not a
    tenant, figure or amount in the page or in any websocket frame. Signed in, the same
    checks find them."""
    from playwright.sync_api import WebSocket, sync_playwright

    frames: list[bytes] = []

    def listen(socket: WebSocket) -> None:
        def keep(payload: Any) -> None:
            frames.append(payload if isinstance(payload, bytes) else str(payload).encode())

        socket.on("framereceived", keep)

    settings = {**PRODUCTION, "KVGATE_DASHBOARD_PASSWORD": PASSWORD}
    with dashboard(tmp_path, **settings) as served, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            page.on("websocket", listen)
            for path in PAGES:
                page.goto(f"{served.url}/{path}", wait_until="domcontentloaded")
                page.get_by_label("Dashboard password").wait_for(timeout=30_000)
                page.wait_for_timeout(500)  # anything the run sends after the form
                assert found(b"".join(frames), served.secrets) == [], path
                assert found(page.content(), served.secrets) == [], path
                assert page.locator('[data-testid="stSidebar"]').count() == 0, path
            before = len(frames)
            print(f"\nChromium before sign-in: {before} frames, {sum(map(len, frames))} B")
            page.get_by_label("Dashboard password").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.get_by_role("heading", name="Requests").wait_for(timeout=30_000)
            sidebar = page.locator('[data-testid="stSidebar"]')
            sidebar.get_by_text("Sign out").wait_for(timeout=30_000)
            page.goto(served.url, wait_until="domcontentloaded")  # a new session: the form
            page.get_by_label("Dashboard password").wait_for(timeout=30_000)
        finally:
            browser.close()
    assert found(b"".join(frames[before:]), TENANTS) == list(TENANTS)


BAD_TILE = ("None", "nan", "NaN")
PREVIOUS_WEEK = "vs previous 7 days"  # the seeded world has traffic the week before
# Tile titles and changes whose text does not fit their box (cut off, or ended with an
# ellipsis).
TILE_TEXT = ", ".join(
    f'[data-testid="stMetric{part}"]' for part in ("Label", "Delta", "DeltaDescription")
)
CLIPPED = """parts => parts
    .filter(part => [part, ...part.querySelectorAll("*")]
        .some(e => e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1))
    .map(part => part.innerText)"""


# Streamlit draws a table on a canvas; glide-data-grid mirrors the cells it has drawn in
# an accessible <table> inside it, a None or NaN there as an empty cell (the canvas shows
# "None"). Only the cells in view are mirrored, so each table is scrolled through.
BAD_CELL = ("", "None", "nan", "NaN", "NaT", "<NA>", "null")
CELLS = """async grid => {
    const scroller = grid.querySelector(".dvn-scroller");
    const cells = new Map();
    const drawn = () => new Promise(done => setTimeout(done, 250));
    const read = () => {
        const heads = {};
        for (const th of grid.querySelectorAll("th[role=columnheader]"))
            heads[th.getAttribute("aria-colindex")] = th.innerText;
        for (const tr of grid.querySelectorAll("tbody tr"))
            for (const td of tr.querySelectorAll("td"))
                cells.set(`${tr.getAttribute("aria-rowindex")}:${td.getAttribute("aria-colindex")}`,
                          [heads[td.getAttribute("aria-colindex")], td.innerText.trim()]);
    };
    const over = scroller.scrollWidth - scroller.clientWidth;
    const across = Math.max(1, scroller.clientWidth - 40);
    const down = Math.max(1, scroller.clientHeight - 40);
    for (let top = 0; top < scroller.scrollHeight; top += down)
        for (let left = 0; left < scroller.scrollWidth; left += across) {
            scroller.scrollTo(left, top);
            await drawn();
            read();
        }
    scroller.scrollTo(0, 0);
    return {cells: [...cells.values()], over, folded: !!grid.closest('[data-testid="stExpander"]')};
}"""


@dataclass(frozen=True)
class Table:
    """A table as Chromium drew it: its cells as (column, text), how many pixels of it run
    past its frame sideways, and whether it is under an "All columns" expander."""

    cells: list[tuple[str, str]]
    over: int
    folded: bool


def tables_of(page: Any) -> list[Table]:
    """Every table on the page, "All columns" expanders opened."""
    for summary in page.locator('[data-testid="stExpander"] summary').all():
        if summary.get_attribute("aria-expanded") != "true":
            summary.click()
    page.wait_for_timeout(1000)
    grids = page.locator('[data-testid="stDataFrame"]')
    found = []
    for n in range(grids.count()):
        grids.nth(n).scroll_into_view_if_needed()
        drawn = grids.nth(n).evaluate(CELLS)
        found.append(
            Table([(c, t) for c, t in drawn["cells"]], int(drawn["over"]), drawn["folded"])
        )
    return found


# A rate chart's points as drawn: (chart title, the point's aria-label, its y in pixels).
RATE_POINTS = """charts => charts.flatMap(chart => {
    const title = chart.querySelector(".role-title-text")?.textContent ?? "";
    return [...chart.querySelectorAll('g.mark-symbol path[aria-roledescription="point"]')]
        .map(point => [title, point.getAttribute("aria-label"),
                       point.transform.baseVal.consolidate().matrix.f]);
})"""
# The seeded price book cuts every class of model "m" on July 1st.
RATE_CHARTS = {f"{name} rate per 1M tokens" for name in ("Input", "Cache-read", "Output")}
MIN_STEP = 20  # pixels: a change of rate the eye sees at a glance (plots are 250 high)


def steps(drawn: list[tuple[str, str, float]]) -> dict[tuple[str, str], list[float]]:
    """Each rate chart's series: the pixel heights of its rates' changes (none: unchanged)."""
    heights: dict[tuple[str, str], dict[str, float]] = {}
    for title, label, y in drawn:
        fields = dict(part.split(": ", 1) for part in label.split("; "))
        heights.setdefault((title, fields["model"]), {})[fields["value"]] = y
    return {
        key: [abs(b - a) for a, b in itertools.pairwise(ys)]
        for key, rates in heights.items()
        for ys in [sorted(rates.values())]
    }


def full_page(page: Any, path: Path) -> None:
    """A screenshot of the whole page: Streamlit scrolls its main block inside the window,
    so the window is made as tall as that block's content for the shot."""
    height = page.locator('[data-testid="stMain"]').evaluate("main => main.scrollHeight")
    page.set_viewport_size({"width": WIDTH, "height": max(HEIGHT, height)})
    page.wait_for_timeout(500)  # the charts redraw at the new size
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})


def test_every_page_draws_readable_charts_and_sound_tiles(served: Seeded) -> None:
    """Every page in Chromium: no exception, every chart drawn and at least its minimum
    height (plot area and frame, see dashboard/charts.py), no tile reading None or nan,
    no table cell (every table, "All columns" opened) empty or reading None, nan or NaT,
    no table but an "All columns" one wider than the page,
    no tile title cut off, every overview tile with its change since the previous week,
    and a full-page screenshot of each under test-artifacts/dashboard/ (the Tenants page's
    budgets and refusals in one more, tenants-budgets.png)."""
    from playwright.sync_api import sync_playwright

    from dashboard import charts

    folder = ARTIFACTS / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, int] = {}
    cells: dict[str, int] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            for path, title in (
                ("", "Overview"),
                ("tenants", "Tenants"),
                ("models", "Models and prices"),
                ("routing", "Routing"),
                ("requests", "Requests"),
            ):
                page.goto(f"{served.url}/{path}", wait_until="domcontentloaded")
                page.get_by_role("heading", name=title).wait_for(timeout=30_000)
                # The page's run is over once no run is shown going and its element count
                # holds still for a second.
                # (The count is read first on every turn: read only when no run showed, it
                # was unset on a turn where a run showed and then ended.)
                count = -1
                running = page.locator('[data-testid="stStatusWidget"]')
                while True:
                    now = page.locator('[data-testid="stElementContainer"]').count()
                    if not running.count() and now == count:
                        break
                    count = now if not running.count() else -1
                    page.wait_for_timeout(1000)
                name = path or "overview"
                assert page.locator('[data-testid="stException"]').count() == 0, name
                elements = page.locator('[data-testid="stVegaLiteChart"]')
                for n in range(elements.count()):
                    chart = elements.nth(n)
                    chart.scroll_into_view_if_needed()
                    chart.locator("canvas, svg.marks").first.wait_for(timeout=30_000)
                    box = chart.bounding_box()
                    assert box is not None and box["height"] >= charts.PLOT + charts.FRAME, (
                        name,
                        n,
                        box,
                    )
                drawn[name] = elements.count()
                for value in page.locator('[data-testid="stMetricValue"]').all_inner_texts():
                    assert value.strip() not in BAD_TILE, (name, value)
                full_page(page, folder / f"{name}.png")
                tiles = page.locator(TILE_TEXT)
                assert tiles.evaluate_all(CLIPPED) == [], name
                if name == "overview":
                    tiles = page.locator('[data-testid="stMetric"]')
                    labels = tiles.locator('[data-testid="stMetricLabel"]').all_inner_texts()
                    changes = [
                        [
                            tiles.nth(n)
                            .locator(f'[data-testid="stMetric{part}"]')
                            .all_inner_texts()
                            for part in ("Delta", "DeltaDescription")
                        ]
                        for n in range(tiles.count())
                    ]
                    assert len(changes) == 12, changes
                    for (delta, description), label in zip(changes, labels, strict=True):
                        assert len(delta) == 1 and delta[0].strip(), (label, delta)
                        assert description == [PREVIOUS_WEEK], (label, description)
                if name == "tenants":  # the budgets table and refusals, above the trends
                    page.get_by_role("heading", name="Budgets").scroll_into_view_if_needed()
                    page.get_by_role("heading", name="Budgets").evaluate(
                        "heading => heading.scrollIntoView({block: 'start'})"
                    )
                    page.wait_for_timeout(500)
                    page.screenshot(path=str(folder / "tenants-budgets.png"))
                if name == "models":  # every change of rate a visible step, per class
                    found = steps(
                        page.locator('[data-testid="stVegaLiteChart"]').evaluate_all(RATE_POINTS)
                    )
                    rated = {k: v for k, v in found.items() if "rate per 1M tokens" in k[0]}
                    changed = [k for k, v in rated.items() if v]
                    assert {title for title, _ in changed} >= RATE_CHARTS, rated
                    for key, heights in rated.items():
                        assert all(h >= MIN_STEP for h in heights), (key, heights)
                tables = tables_of(page)
                cells[name] = sum(len(t.cells) for t in tables)
                for n, table in enumerate(tables):
                    assert table.cells, (name, n, "no cell read")
                    bad = [(column, text) for column, text in table.cells if text in BAD_CELL]
                    assert bad == [], (name, n, bad)
                    # A shown table fits the page; only "All columns" may scroll sideways.
                    assert table.folded or table.over <= 1, (name, n, table.over, table.cells)
        finally:
            browser.close()
    print(f"\ncharts drawn per page: {drawn}; table cells read: {cells}")
    assert drawn["overview"] == 4 and drawn["routing"] >= 1 and drawn["models"] >= 1
