"""One stack of real processes on loopback: a prepared database, `kvgate sim` replicas, the
provider emulator, and `kvgate serve` in front of them.

    with running_stack(tmp, database_url, tenants=("alpha",)) as stack:
        stack.start_sims(2)
        stack.configure([vllm(MODEL, stack.sim_urls)])
        stack.start_gateway()
        stack.client("alpha").chat.completions.create(...)
        [row] = stack.rows(count=1)

The database is prepared in-process (migrations, the catalog's prices, tenants and keys
through ``gateway.db.crud``: a CLI process costs seconds on a busy 2-core machine), or
through the real CLI with ``cli=True`` where that is what a test is about.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
from sqlalchemy import Engine, select
from sqlalchemy.sql import ColumnElement

from gateway.db import crud
from gateway.db.migrate import upgrade
from gateway.db.models import RequestRow
from gateway.db.session import make_engine, session_factory, transaction
from pricing.book import Price, load_catalog
from tests.factories import config_file, tenant
from tests.support.processes import (
    Proc,
    cli_tenant,
    gateway_env,
    kvgate,
    start_emulator,
    start_gateway,
    start_sim,
    wait_recorded,
)

SIM_MODEL = "kvgate/demo-llama-8b"
# Simulated replicas that answer at once: for tests about answers and records, not latency.
INSTANT = ("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "0")


@dataclass
class Stack:
    """The processes of one test (or module, or session), and what tests read from them."""

    tmp: Path
    database_url: str
    env: dict[str, str]
    engine: Engine
    cli: bool = False
    sims: list[Proc] = field(default_factory=list)
    emulator: Proc | None = None
    gateway: Proc | None = None
    # More processes a test started itself (a second gateway, a restarted one): stopped too.
    others: list[Proc] = field(default_factory=list)
    config: Path | None = None
    keys: dict[str, str] = field(default_factory=dict)
    key_ids: dict[str, str] = field(default_factory=dict)
    tenant_ids: dict[str, str] = field(default_factory=dict)
    # Secrets the stack runs with (name -> value): never to be shown, like the tenants' keys.
    hidden: dict[str, str] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)

    # -- the database ------------------------------------------------------------------

    def tenant(self, name: str, *, cache_group: str | None = None) -> str:
        """A new tenant with one key (through the CLI if the stack says so); its key."""
        if self.cli:
            key, key_id = cli_tenant(self.env, name)
            if cache_group is not None:
                kvgate("tenants", "set-group", name, "--cache-group", cache_group, env=self.env)
            self.keys[name], self.key_ids[name] = key, key_id
            return key
        with transaction(session_factory(self.engine)) as session:
            made = tenant(session, name, cache_group=cache_group)
        self.keys[name], self.key_ids[name], self.tenant_ids[name] = made.key, made.key_id, made.id
        return made.key

    def secrets(self) -> dict[str, str]:
        """Everything that must never be shown: the secrets it runs with, the tenants' keys."""
        return {**self.hidden, **self.keys}

    @property
    def key(self) -> str:
        """The key of the stack's only tenant."""
        [only] = self.keys.values()
        return only

    # -- processes ---------------------------------------------------------------------

    def start_sims(
        self, count: int = 1, *, extra: Sequence[str] = INSTANT, model: str = SIM_MODEL
    ) -> list[Proc]:
        """``count`` more `kvgate sim` replicas."""
        started = [start_sim(self.tmp, model=model, extra=tuple(extra)) for _ in range(count)]
        self.sims.extend(started)
        return started

    @property
    def sim_urls(self) -> list[str]:
        return [sim.url for sim in self.sims]

    def start_emulator(self, *args: str) -> Proc:
        """tests/providers' emulator of hosted providers, in its own process."""
        self.emulator = start_emulator(self.tmp, *args)
        return self.emulator

    def configure(self, models: Iterable[Mapping[str, Any]]) -> Path:
        """Write the gateway's ``kvgate.yaml`` (tests.factories' ``vllm``/``litellm`` entries)."""
        self.config = config_file(self.tmp / "kvgate.yaml", models)
        return self.config

    def start_gateway(self, port: int | None = None, args: Sequence[str] = ()) -> Proc:
        """`kvgate serve` over the configured deployments, ready to record."""
        assert self.config is not None, "configure() the deployments first"
        self.gateway = start_gateway(self.tmp, self.config, self.env, port=port, args=args)
        return self.gateway

    @property
    def url(self) -> str:
        assert self.gateway is not None, "no gateway started"
        return self.gateway.url

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def close(self) -> None:
        """Stop every process the stack started."""
        for proc in (self.gateway, *self.others, *self.sims, self.emulator):
            if proc is not None:
                proc.stop()
        self.engine.dispose()

    # -- what tests read ---------------------------------------------------------------

    def client(self, tenant: str | None = None) -> openai.OpenAI:
        """The official client for a tenant (the only one, by default), no retries."""
        key = self.keys[tenant] if tenant is not None else self.key
        return openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=0)

    def rows(
        self, *where: ColumnElement[bool], count: int | None = None, timeout_s: float = 10.0
    ) -> list[RequestRow]:
        """Request rows (those matching ``where``), by start; everything the gateway has
        accepted is written first, and with ``count`` they are waited for until there are
        that many (a cancelled request's record is kept just after its client left)."""
        deadline = time.monotonic() + timeout_s
        while True:
            wait_recorded(self.url, timeout_s=timeout_s)
            with session_factory(self.engine)() as session:
                query = select(RequestRow).where(*where).order_by(RequestRow.started_at)
                rows = list(session.scalars(query))
            if count is None or len(rows) >= count or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)

    def statement(
        self, tenant: str | None = None, start: str | None = None, end: str | None = None
    ) -> dict[str, Any]:
        """A tenant's billing statement through the gateway (today's, by default)."""
        today = datetime.now(UTC).date().isoformat()
        key = self.keys[tenant] if tenant is not None else self.key
        reply = httpx.get(
            self.url + "/v1/billing/statement",
            params={"start": start or today, "end": end or today},
            headers={"authorization": f"Bearer {key}"},
        )
        reply.raise_for_status()
        return dict(reply.json())

    def log_size(self) -> int:
        assert self.gateway is not None
        return self.gateway.log.stat().st_size

    def log_since(self, offset: int) -> str:
        """What the gateway has logged since ``offset`` (from ``log_size``)."""
        assert self.gateway is not None
        with self.gateway.log.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")


def open_stack(
    tmp: Path,
    database_url: str,
    *,
    tenants: Iterable[str] = (),
    prices: Iterable[Price] | None = None,
    cli: bool = False,
    **env: str,
) -> Stack:
    """A migrated database with ``prices`` (the catalog's, by default) and ``tenants``; the
    gateway's environment (``env`` are more KVGATE_* settings). Nothing started yet."""
    full_env = gateway_env(database_url, tmp / "journal", **env)
    if cli:
        kvgate("db", "upgrade", env=full_env)
        if prices is None:
            kvgate("prices", "sync", env=full_env)
    else:
        upgrade(database_url)
    stack = Stack(tmp, database_url, full_env, make_engine(database_url), cli=cli)
    if not cli or prices is not None:
        with transaction(session_factory(stack.engine)) as session:
            crud.add_prices(session, prices=load_catalog() if prices is None else prices)
    for name in tenants:
        stack.tenant(name)
    return stack


@contextlib.contextmanager
def running_stack(tmp: Path, database_url: str, **options: Any) -> Iterator[Stack]:
    """``open_stack``, closed (every process stopped) at the end."""
    stack = open_stack(tmp, database_url, **options)
    try:
        yield stack
    finally:
        stack.close()
