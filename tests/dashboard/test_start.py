"""`kvgate dashboard` itself: refused in production without a real password, before
Streamlit starts; in development it starts open and says so."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dashboard.launcher import OPEN_WARNING
from tests.dashboard.served import PRODUCTION
from tests.support.processes import free_port


def start(tmp_path: Path, port: int, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update({"KVGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'kvgate.db'}", **settings})
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "dashboard", "--port", str(port)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("password", "message"),
    [
        (None, "KVGATE_DASHBOARD_PASSWORD must be set in production: the dashboard shows "),
        ("change-me", "KVGATE_DASHBOARD_PASSWORD must be set in production: the dashboard "),
        ("short-11-ch", "KVGATE_DASHBOARD_PASSWORD must be at least 12 characters in production"),
    ],
)
def test_a_production_dashboard_without_a_real_password_refuses_to_start(
    tmp_path: Path, password: str | None, message: str
) -> None:
    """One line, exit 2, and Streamlit never ran: nothing listened, nothing was served."""
    port = free_port()
    settings = dict(PRODUCTION)
    if password is not None:
        settings["KVGATE_DASHBOARD_PASSWORD"] = password
    began = time.monotonic()
    result = start(tmp_path, port, **settings)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {message}")
    assert password is None or password not in result.stderr
    assert "Streamlit" not in result.stderr and "Uvicorn" not in result.stderr
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    print(f"\nrefused in {time.monotonic() - began:.2f} s")


def test_a_development_dashboard_without_a_password_warns_that_it_is_open(
    tmp_path: Path,
) -> None:
    """It starts (tests/dashboard/test_websocket.py uses one); the warning comes first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update(
        {"KVGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'kvgate.db'}", "HOME": str(tmp_path)}
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "dashboard", "--port", str(free_port())],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        assert process.stderr.readline() == f"warning: {OPEN_WARNING}\n"
    finally:
        process.terminate()
        process.wait(timeout=30)
