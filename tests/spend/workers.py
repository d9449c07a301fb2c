"""One worker's admission in process, on a real database: what the rate-limit tests and
benchmarks/admission.py drive (the rules as the database holds them, prices from
``tests.factories.BOOK``, a chat request to deployment ``m``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy.engine import Engine

from gateway.auth import Principal
from gateway.budgets import RateLimit
from gateway.config import Deployment
from gateway.db import spend
from gateway.db.session import session_factory
from gateway.mirror import Mirror
from gateway.serving.admission import Admission
from gateway.serving.calls import Call, Endpoint
from gateway.serving.context import Context
from tests.factories import BOOK, Tenant

DEPLOYMENT = Deployment(name="m", replicas=("http://127.0.0.1:9",))  # type: ignore[arg-type]


def limits_of(engine: Engine) -> Mirror[tuple[RateLimit, ...]]:
    """The rate limits in the database, as a worker holds them (``reload`` for changes)."""
    factory = session_factory(engine)

    def load() -> tuple[int, tuple[RateLimit, ...]]:
        with factory() as session:
            return spend.load_limits(session)

    mirror = Mirror("limits", load, ())
    mirror.reload()
    return mirror


def worker(
    engine: Engine,
    clock: Callable[[], datetime],
    limits: Mirror[tuple[RateLimit, ...]] | None = None,
) -> Admission:
    """One worker's admission, following the budgets and limits in the database."""
    factory = session_factory(engine)
    with factory() as session:
        budgets = spend.load_budgets(session)
    ledger: Any = SimpleNamespace(book=BOOK)  # only its prices are asked for
    return Admission(
        sessions=factory,
        ledger=ledger,
        budgets=Mirror("budgets", lambda: budgets, budgets[1]),
        limits=limits or limits_of(engine),
        clock=clock,
    )


def context(tenant: Tenant, number: int) -> Context:
    """The ``number``th chat request of ``tenant`` (8 output tokens at most)."""
    call = Call(
        endpoint=Endpoint.CHAT,
        model="m",
        body={"max_tokens": 8},
        stream=False,
        client_wants_usage=False,
        client_salt=None,
        interaction_hint=None,
        prompt_chars=5,
        body_bytes=100,
    )
    return Context(
        request_id=f"req_{number}",
        interaction_id=f"req_{number}",
        principal=Principal(tenant.id, tenant.name, tenant.key_id, "scope"),
        deployment=DEPLOYMENT,
        call=call,
    )
