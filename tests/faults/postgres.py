"""A private Postgres server for tests that stop and start their database.

The shared server on 5432 serves every other test at once, so an outage is staged on a
server of the test's own: ``initdb`` into a fresh directory, ``pg_ctl`` start and stop on
a free loopback port. Postgres refuses to run as root, so its tools run as the
``postgres`` OS user in a directory that user owns.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.processes import free_port

OS_USER = "postgres"


def _as_postgres(*args: str) -> list[str]:
    return ["runuser", "-u", OS_USER, "--", *args] if os.geteuid() == 0 else list(args)


class PrivatePostgres:
    """One throw-away Postgres cluster; ``stop`` and ``start`` stage an outage."""

    def __init__(self) -> None:
        if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
            pytest.skip("initdb/pg_ctl not on PATH (a private Postgres is needed)")
        self.port = free_port()
        # Under /tmp, not pytest's tmp_path: the postgres user must be able to reach it.
        self.root = Path(tempfile.mkdtemp(prefix="kvgate-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, user=OS_USER)
        self.data = self.root / "data"
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(_as_postgres(*args), check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        subprocess.run(
            _as_postgres("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)
