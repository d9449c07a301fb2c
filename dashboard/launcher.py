"""How the dashboard is started: ``streamlit run dashboard/app.py``, headless."""

from __future__ import annotations

import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"


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
