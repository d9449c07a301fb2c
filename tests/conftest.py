"""Shared fixtures: a fresh database on SQLite and (when configured) on Postgres.

Every database test runs on both: set ``KVGATE_TEST_DATABASE_URL`` to a Postgres server
(CI sets it to the one on 127.0.0.1:5432). Each test gets its own empty database.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gateway.db.migrate import upgrade
from gateway.db.session import normalise_url

POSTGRES_URL = os.environ.get("KVGATE_TEST_DATABASE_URL")
REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def _backends() -> list[pytest.param]:  # type: ignore[valid-type]
    return [
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]


@contextmanager
def new_database(backend: str, directory: Path) -> Iterator[str]:
    """A new, empty database: a SQLite file, or a fresh Postgres database dropped after."""
    if backend == "sqlite":
        yield f"sqlite:///{directory / 'kvgate.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip("KVGATE_TEST_DATABASE_URL is not set (CI sets it; see README)")
    name = "kvgate_test_" + secrets.token_hex(6)
    admin = create_engine(normalise_url(POSTGRES_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield (
            make_url(normalise_url(POSTGRES_URL))
            .set(database=name)
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=_backends())
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with new_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def database_url(empty_database_url: str) -> str:
    """A new database with every migration applied."""
    upgrade(empty_database_url)
    return empty_database_url
