"""Shared fixtures: a fresh database on SQLite and (when configured) on Postgres.

Every database test runs on both: set ``KVGATE_TEST_DATABASE_URL`` to a Postgres server
(CI sets it to the one on 127.0.0.1:5432). Each test gets its own database: empty, or
migrated (a copy of one database migrated once per session and backend).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
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
def new_database(backend: str, directory: Path, *, template: str | None = None) -> Iterator[str]:
    """A new database: a SQLite file, or a fresh Postgres database dropped after; empty, or
    a copy of ``template`` (a database URL of the same backend)."""
    if backend == "sqlite":
        path = directory / "kvgate.db"
        if template is not None:
            _copy_sqlite(make_url(template).database or "", path)
        yield f"sqlite:///{path}"
        return
    if not POSTGRES_URL:
        pytest.skip("KVGATE_TEST_DATABASE_URL is not set (CI sets it; see README)")
    name = "kvgate_test_" + secrets.token_hex(6)
    admin = create_engine(normalise_url(POSTGRES_URL), isolation_level="AUTOCOMMIT")
    copy = f' TEMPLATE "{make_url(template).database}"' if template is not None else ""
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"{copy}'))
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


def _copy_sqlite(source: str, target: Path) -> None:
    with sqlite3.connect(source) as original, sqlite3.connect(target) as copy:
        original.backup(copy)
    copy.close()
    original.close()


@pytest.fixture(scope="session")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], str]]:
    """Per backend, one database with every migration applied, made on first use: tests get
    copies of it (migrating each test's database took most of a short test's time)."""
    made: dict[str, str] = {}
    with ExitStack() as stack:

        def template(backend: str) -> str:
            if backend not in made:
                directory = tmp_path_factory.mktemp(f"migrated-{backend}")
                url = stack.enter_context(new_database(backend, directory))
                upgrade(url)
                made[backend] = url
            return made[backend]

        yield template


@pytest.fixture(params=_backends())
def backend(request: pytest.FixtureRequest) -> str:
    """Each database test runs on SQLite and (when configured) on Postgres."""
    return str(request.param)


@pytest.fixture
def empty_database_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A new, empty database."""
    with new_database(backend, tmp_path) as url:
        yield url


@pytest.fixture
def database_url(backend: str, tmp_path: Path, migrated: Callable[[str], str]) -> Iterator[str]:
    """A new database with every migration applied."""
    with new_database(backend, tmp_path, template=migrated(backend)) as url:
        yield url
