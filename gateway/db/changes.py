"""Changes every gateway must see at once: a revision per kind of data (keys, prices, and
whatever else gateways hold in memory), bumped in the change's own transaction, announced
to every gateway process sharing the database and, on Postgres, confirmed by each.

    writer (CLI, admin API)                        each gateway process (db/feed.py)
    LISTEN kvgate_acks                (Postgres)
    BEGIN; the change; bump(kind):
      UPDATE changes SET revision + 1
      NOTIFY kvgate_changes 'prices 7'  ─commit─▶  reload prices (revision >= 7), install
    wait for each listener's ack     ◀───────────  NOTIFY kvgate_acks '<its pid> prices 7'
    return

A writer returns once every gateway process listening on that database has its new copy
installed (or, past ``CONFIRM_TIMEOUT_S``, says which did not), so the change applies to
every request that starts after the writer returned. Gateway processes are found in
``pg_stat_activity`` by their listening connection's ``application_name``; one that is
cut off from the database is not waited for, and reloads everything when it is back.

SQLite announces nothing: each gateway process reads the file's ``PRAGMA data_version``
(shared memory, no I/O) before it uses its copy and reloads a kind whose revision moved,
so there a change applies from the writer's commit on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.models import ChangeRow

KEYS = "keys"
PRICES = "prices"
CHANNEL = "kvgate_changes"  # payload: "<kind> <revision>"
ACKS = "kvgate_acks"  # payload: "<listener backend pid> <kind> <revision>"
LISTENER = "kvgate-changes"  # application_name prefix of a gateway's listening connection
CONFIRM_TIMEOUT_S = 5.0
_BUMPED = "kvgate.changes.bumped"  # Session.info key: the revisions this transaction made

T = TypeVar("T")


def bump(session: Session, kind: str) -> int:
    """Mark ``kind`` changed in this transaction; gateways learn of it when it commits."""
    now = datetime.now(UTC)
    revision = session.scalar(
        update(ChangeRow)
        .where(ChangeRow.kind == kind)
        .values(revision=ChangeRow.revision + 1, changed_at=now)
        .returning(ChangeRow.revision)
    )
    if revision is None:  # a kind no migration seeded
        revision = 1
        session.execute(insert(ChangeRow).values(kind=kind, revision=revision, changed_at=now))
    if session.get_bind().dialect.name == "postgresql":
        # Delivered by Postgres at commit, and only if the transaction commits.
        session.execute(select(func.pg_notify(CHANNEL, f"{kind} {revision}")))
    session.info.setdefault(_BUMPED, {})[kind] = revision
    return int(revision)


def revisions(session: Session) -> dict[str, int]:
    """Every kind's current revision."""
    rows = session.execute(select(ChangeRow.kind, ChangeRow.revision))
    return {kind: int(rev) for kind, rev in rows}


def revision(session: Session, kind: str) -> int:
    """One kind's current revision (0 before its first change)."""
    value = session.scalar(select(ChangeRow.revision).where(ChangeRow.kind == kind))
    return int(value or 0)


def listener_name(kinds: Iterable[str]) -> str:
    """The application_name of a gateway's listening connection: which kinds it keeps."""
    return f"{LISTENER} {','.join(sorted(kinds))}"[:63]  # NAMEDATALEN - 1


def kinds_listened(application_name: str) -> set[str]:
    """The kinds a connection's ``application_name`` listens for; none unless a listener's."""
    prefix, _, kinds = application_name.partition(" ")
    return set(kinds.split(",")) if prefix == LISTENER and kinds else set()


def conninfo(url: URL) -> str:
    """A libpq connection URI for a SQLAlchemy Postgres URL (whatever driver it names)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass(frozen=True, slots=True)
class Published:
    """What a change reached: its revisions, and the gateway processes that confirmed them."""

    revisions: dict[str, int] = field(default_factory=dict)
    confirmed: int = 0
    unconfirmed: tuple[str, ...] = ()
    seconds: float = 0.0


class _Acks:
    """The writer's side of a Postgres change: listening for confirmations before it commits."""

    def __init__(self, engine: Engine) -> None:
        import psycopg

        self.connection = psycopg.connect(conninfo(engine.url), autocommit=True)
        self.connection.execute(f"LISTEN {ACKS}")

    def listeners(self, kinds: set[str]) -> dict[int, tuple[set[str], str]]:
        """The gateway processes connected now that keep any of ``kinds``."""
        rows = self.connection.execute(
            "SELECT pid, application_name, coalesce(host(client_addr), 'local')"
            " FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE %s",
            (LISTENER + " %",),
        ).fetchall()
        found = {pid: (kinds_listened(name) & kinds, str(address)) for pid, name, address in rows}
        return {pid: entry for pid, entry in found.items() if entry[0]}

    def wait(self, revisions: dict[str, int], timeout_s: float) -> Published:
        """Until every listener has confirmed each kind at its new revision (or timeout)."""
        started = time.monotonic()
        deadline = started + timeout_s
        listeners = self.listeners(set(revisions))
        pending = {(pid, kind) for pid, (kinds, _) in listeners.items() for kind in kinds}
        waited_for = len(listeners)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for notify in self.connection.notifies(timeout=min(remaining, 0.1)):
                pid, kind, revision = _ack(notify.payload)
                if revision >= revisions.get(kind, revision + 1):
                    pending.discard((pid, kind))
                if not pending:
                    break
            if not pending:
                break
            # A listener that disconnected will reload everything when it reconnects.
            alive = self.listeners(set(revisions))
            pending = {(pid, kind) for pid, kind in pending if pid in alive}
        late = sorted({pid for pid, _ in pending})
        return Published(
            revisions=revisions,
            confirmed=waited_for - len(late),
            unconfirmed=tuple(f"pid {pid} at {listeners[pid][1]}" for pid in late),
            seconds=time.monotonic() - started,
        )

    def close(self) -> None:
        self.connection.close()


def _ack(payload: str) -> tuple[int, str, int]:
    try:
        pid, kind, revision = payload.split()
        return int(pid), kind, int(revision)
    except ValueError:
        return -1, "", -1


def publish(
    factory: sessionmaker[Session],
    work: Callable[[Session], T],
    *,
    timeout_s: float = CONFIRM_TIMEOUT_S,
) -> tuple[T, Published]:
    """Run ``work`` in a transaction and return once every gateway applies what it changed.

    ``work`` marks what it changes with ``bump`` (the crud functions do).
    """
    engine: Any = factory.kw["bind"]
    acks = _Acks(engine) if engine.dialect.name == "postgresql" else None
    try:
        with factory() as session, session.begin():
            result = work(session)
            bumped = dict(session.info.pop(_BUMPED, {}))
        if acks is None or not bumped:
            return result, Published(revisions=bumped)
        return result, acks.wait(bumped, timeout_s)
    finally:
        if acks is not None:
            acks.close()
