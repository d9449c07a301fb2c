"""The real thing: `kvgate dashboard` on loopback, opened in Debian's headless Chromium.

Needs `apt-get install -y chromium` (the test set-up does it); playwright only drives
that browser, it never downloads one. The screenshot is left in test-artifacts/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.accounting.recorder import insert_records
from gateway.db import crud
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from tests.dashboard.conftest import JAN, JUL, world_records
from tests.support.processes import Proc, free_port, wait_http

CHROMIUM = "/usr/bin/chromium"
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
def dashboard(tmp_path: Path) -> Iterator[str]:
    """A dashboard process on a SQLite database holding the test world; yields its URL."""
    url = f"sqlite:///{tmp_path / 'kvgate.db'}"
    upgrade(url)
    engine = make_engine(url)
    with transaction(session_factory(engine)) as session:
        crud.add_prices(session, prices=[JAN, JUL])
        a = crud.create_tenant(session, name="acme").id
        b = crud.create_tenant(session, name="bravo").id
    insert_records(engine, world_records(a, b))
    engine.dispose()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update({"KVGATE_DATABASE_URL": url, "HOME": str(tmp_path)})
    log = tmp_path / "dashboard.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "dashboard", "--port", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    proc = Proc(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_http(proc.url + "/_stcore/health", timeout_s=30, process=process)
        yield proc.url
    finally:
        proc.stop()
        if process.returncode not in (0, -15):
            print(proc.output())


def test_the_overview_renders_its_figures_and_charts_in_chromium(dashboard: str) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard-overview.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1300})
            page.goto(dashboard, wait_until="domcontentloaded")
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
    assert "USD 0.150974155" in text  # spend: opens on the week up to the last traffic
    assert "Completed interactions" in text and "Routing efficiency" in text
    for page_name in ("Overview", "Tenants", "Models and prices", "Routing", "Requests"):
        assert page_name in sidebar
    assert shot.stat().st_size > 20_000
    assert shutil.which("chromium") or Path(CHROMIUM).exists()
