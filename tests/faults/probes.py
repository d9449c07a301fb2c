"""Reading a running stack from the outside: /metrics, /healthz, RSS, the records."""

from __future__ import annotations

import json
import re
import urllib.request
from collections import Counter
from pathlib import Path

from sqlalchemy import Engine, func, select

from gateway.db.models import RequestRow, UsageHourRow


def metric(url: str, name: str, labels: str = "") -> float:
    """One sample of a Prometheus text endpoint (``labels``: a substring of its label set)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    for match in pattern.finditer(text):
        if labels in (match.group(1) or ""):
            return float(match.group(2))
    raise LookupError(f"{name}{{{labels}}} not in {url}/metrics")


def healthz(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url + "/healthz", timeout=5) as reply:
        data: dict[str, object] = json.loads(reply.read())
        return data


def rss_kib(pid: int) -> int:
    """Resident memory of a process (VmRSS), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError(f"no VmRSS for {pid}")


def writer_pid(gateway_pid: int) -> int:
    """The gateway's database writer: its spawned child (not the resource tracker)."""
    for child in Path(f"/proc/{gateway_pid}/task/{gateway_pid}/children").read_text().split():
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise LookupError(f"no writer process under {gateway_pid}")


def rollup_requests(engine: Engine) -> int:
    """Requests counted by the hourly rollups (a replayed record counted twice shows here)."""
    with engine.connect() as connection:
        return int(connection.scalar(select(func.sum(UsageHourRow.requests))) or 0)


def status_counts(engine: Engine) -> Counter[str]:
    with engine.connect() as connection:
        rows = connection.execute(select(RequestRow.status, func.count()).group_by("status"))
        return Counter({status: count for status, count in rows})


def completed_ids(engine: Engine) -> list[str]:
    """Request ids of completed records (duplicates kept, so a test can see them)."""
    with engine.connect() as connection:
        query = select(RequestRow.request_id).where(RequestRow.status == "completed")
        return list(connection.scalars(query))
