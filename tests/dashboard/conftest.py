"""A small known world of requests, and the dashboard under Streamlit's AppTest."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Record, Status
from gateway.db.session import make_engine, session_factory
from gateway.usage import Usage
from tests.factories import JAN, JUL, record, tenants

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
FIRST_DAY, LAST_DAY = date(2026, 6, 30), date(2026, 7, 1)


def at(day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    month = 6 if day == 30 else 7
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


def make(
    n: int,
    tenant: str,
    started: datetime,
    usage: Usage,
    *,
    interaction: str,
    status: Status = Status.COMPLETED,
    model: str = "m",
    attempt: int = 1,
    upstream: str = "http://r1",
    ttft_ms: float | None = None,
    predicted: int | None = None,
    ceiling: int | None = None,
    error: str | None = None,
    **fields: Any,
) -> Record:
    """Request ``req_<n>`` of the world: two seconds long, priced by the book."""
    return record(
        f"req_{n}",
        tenant_id=tenant,
        api_key_id="key",
        usage=usage,
        started_at=started,
        took=timedelta(seconds=2),
        ttft_ms=ttft_ms,
        model=model,
        interaction_id=interaction,
        status=status,
        attempt=attempt,
        upstream=upstream,
        predicted_cached_tokens=predicted,
        ceiling_cached_tokens=ceiling,
        error=error,
        **fields,
    )


@dataclass
class World:
    url: str
    sessions: sessionmaker[Session]
    a: str
    b: str
    records: list[Record]


def world_records(a: str, b: str) -> list[Record]:
    """Two tenants over two UTC days, across both price entries, with a retry, a
    conversation completing in two hours, an unpriced model and routing data on some."""
    return [
        make(
            1,
            a,
            at(30, 10, 5),
            Usage(1000, 0, 0, 100),
            interaction="i1",
            ttft_ms=400,
            end_user="alice",
            tags={"team": "search"},
        ),
        make(
            2,
            a,
            at(30, 10, 20),
            Usage(200, 800, 0, 50),
            interaction="i2",
            ttft_ms=100,
            upstream="http://r2",
            predicted=800,
            ceiling=900,
            end_user="alice",
            tags={"env": "prod", "team": "search"},
        ),
        make(
            3,
            a,
            at(1, 0, 0, 1),
            Usage(500, 0, 0, 10),
            interaction="conv",
            attempt=1,
            status=Status.FAILED,
            upstream="http://r2",
            error="upstream 503",
        ),
        make(
            4,
            a,
            at(1, 0, 0, 3),
            Usage(333, 777, 0, 999),
            interaction="conv",
            attempt=2,
            ttft_ms=120,
            predicted=700,
            ceiling=1000,
            end_user="bob",
            tags={"team": "ads"},
        ),
        make(5, a, at(1, 5, 0), Usage(7, 0, 0, 1), interaction="i5", model="unpriced", ttft_ms=800),
        make(
            6,
            b,
            at(1, 0, 30),
            Usage(10**6, 0, 0, 0),
            interaction="i6",
            ttft_ms=2000,
            end_user="alice",
        ),
        make(
            7,
            a,
            at(1, 6, 10),
            Usage(100, 900, 0, 20),
            interaction="conv",
            ttft_ms=90,
            upstream="http://r2",
            predicted=900,
            ceiling=950,
        ),
    ]


@pytest.fixture
def empty_world(database_url: str) -> Iterator[World]:
    engine = make_engine(database_url)
    yield World(database_url, session_factory(engine), "", "", [])
    engine.dispose()


@pytest.fixture
def world(database_url: str) -> Iterator[World]:
    engine = make_engine(database_url)
    sessions = session_factory(engine)
    made = tenants(engine, "acme", "bravo", prices=[JAN, JUL])
    a, b = made["acme"].id, made["bravo"].id
    records = world_records(a, b)
    insert_records(engine, records)
    yield World(database_url, sessions, a, b, records)
    engine.dispose()


def open_app(
    url: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    page: str | None = None,
    start: date = FIRST_DAY,
    end: date = LAST_DAY,
    zone: str = "UTC",
) -> AppTest:
    """The dashboard on ``url``, showing start..end in ``zone``, on ``page`` (a file)."""
    monkeypatch.setenv("KVGATE_DATABASE_URL", url)
    monkeypatch.delenv("KVGATE_DASHBOARD_PASSWORD", raising=False)
    app = AppTest.from_file(str(APP), default_timeout=30).run()
    assert not app.exception, app.exception
    app.selectbox(key="zone").set_value(zone)
    app.date_input(key="period").set_value((start, end))
    app.run()
    if page is not None:
        app.switch_page(f"screens/{page}.py").run()
    assert not app.exception, app.exception
    return app
