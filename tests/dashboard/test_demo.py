"""`kvgate demo` starts the dashboard and feeds the gateway a workload it can show."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gateway.db.models import RequestRow, TenantRow
from gateway.db.session import make_engine
from tests.support.processes import Proc, free_port, wait_http, wait_recorded

pytestmark = pytest.mark.e2e


def test_the_demo_serves_the_dashboard_with_tenants_retries_and_cache_hits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    port, dashboard = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update(
        {
            "KVGATE_DATABASE_URL": url,
            "KVGATE_JOURNAL_DIR": str(tmp_path / "journal"),
            "KVGATE_RECORDER_FLUSH_INTERVAL_S": "0.05",
            "HOME": str(tmp_path),
        }
    )
    log = tmp_path / "demo.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "demo",
            "--port",
            str(port),
            "--sim-ports",
            f"{free_port()},{free_port()}",
            "--workdir",
            str(tmp_path / "demo"),
            "--dashboard-port",
            str(dashboard),
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    demo = Proc(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_http(f"http://127.0.0.1:{dashboard}/_stcore/health", timeout_s=60, process=process)
        deadline = time.monotonic() + 90
        while "demo workload sent" not in demo.output():
            assert time.monotonic() < deadline and process.poll() is None, demo.output()
            time.sleep(0.2)
        wait_recorded(demo.url)
        engine = make_engine(url)
        with engine.connect() as connection:
            tenants = set(connection.scalars(select(TenantRow.name)))
            by_status = dict(
                connection.execute(
                    select(RequestRow.status, func.count()).group_by(RequestRow.status)
                ).all()
            )
            cached = connection.scalar(select(func.sum(RequestRow.cache_read_tokens)))
            retried = connection.scalar(
                select(func.count()).select_from(
                    select(RequestRow.interaction_id)
                    .group_by(RequestRow.tenant_id, RequestRow.interaction_id)
                    .having(func.count(func.distinct(RequestRow.status)) > 1)
                    .subquery()
                )
            )
        engine.dispose()
    finally:
        demo.stop()
    assert {"demo", "acme", "globex", "initech"} <= tenants
    assert by_status["completed"] == 3 * 10  # 4 chats of 3, 2, 2 and 3 turns per tenant
    assert by_status["failed"] == 3  # one refused request per tenant ...
    assert retried == 3  # ... each retried within its interaction
    assert by_status.get("cancelled", 0) == 3
    assert cached and cached > 0  # the shared system prompt was served from cache
