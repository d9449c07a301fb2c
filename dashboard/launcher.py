"""How the dashboard is started: ``streamlit run dashboard/app.py``, headless."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"
OPEN_WARNING = (
    "KVGATE_DASHBOARD_PASSWORD is not set: anyone who reaches the dashboard's port sees "
    "every tenant's figures (allowed in development only)"
)


def command(*, host: str = "127.0.0.1", port: int = 8501) -> list[str]:
    """The command line that serves the dashboard (it reads KVGATE_* from the environment)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        # No file watching or reruns on save: this is a service, not a notebook.
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--client.toolbarMode",
        "viewer",
    ]


def environment(base: Mapping[str, str], trusted_proxies: Sequence[str]) -> dict[str, str]:
    """``base`` with the peers whose X-Forwarded-For Streamlit's uvicorn may believe.

    uvicorn believes the header from loopback unless told otherwise; the sign-in throttle
    counts per client address, so a client that could name its own address would never
    be locked. Only ``KVGATE_DASHBOARD_TRUSTED_PROXIES`` (none by default) are believed.
    """
    return {**base, "FORWARDED_ALLOW_IPS": ",".join(trusted_proxies)}
