"""Engines and sessions for Postgres (production) and SQLite (the embedded default).

The rest of kvgate names these types and errors from here, never from SQLAlchemy: the
database is this package's business alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

__all__ = [
    "REFUSED",
    "DatabaseError",
    "Engine",
    "Session",
    "SessionFactory",
    "make_engine",
    "normalise_url",
    "safe_url",
    "session_factory",
    "transaction",
]

# Anything a database call can raise (unreachable, refused, timed out).
DatabaseError = SQLAlchemyError
# The database refused the data itself: out of range, too long, NUL bytes (DataError), a
# constraint (IntegrityError). Retrying the same row cannot succeed.
REFUSED: tuple[type[Exception], ...] = (DataError, IntegrityError, OverflowError)
SessionFactory = sessionmaker[Session]


def normalise_url(url: str) -> str:
    """Use psycopg 3 for Postgres whatever driver the URL names (or none)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def safe_url(url: str) -> str:
    """The URL with its password hidden, for messages."""
    return make_url(url).render_as_string(hide_password=True)


def make_engine(url: str, *, work_mem: str | None = None) -> Engine:
    """An engine tuned for this workload: WAL and a busy timeout on SQLite; on Postgres,
    ``work_mem`` (e.g. '64MB') for each sort or hash its sessions run, if given."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # Day boundaries in statements are UTC days, whatever the server's zone.
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=5,
        max_overflow=5,
        connect_args={
            "options": "-c timezone=UTC" + (f" -c work_mem={work_mem}" if work_mem else "")
        },
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def session_factory(engine: Engine) -> SessionFactory:
    """Sessions on ``engine`` whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: SessionFactory) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with factory() as session, session.begin():
        yield session
