"""A stack for fault tests: replicas, one gateway, a database, one tenant."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from gateway.db.session import make_engine
from tests.e2e.conftest import make_tenant
from tests.support.processes import (
    Proc,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
    write_config,
)

MODEL = "kvgate/demo-llama-8b"
INSTANT = ("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "0")


@dataclass
class FaultStack:
    tmp: Path
    database_url: str
    env: dict[str, str]
    key: str
    sims: list[Proc]
    config: Path
    engine: Engine
    gateway: Proc | None = None

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    def start_gateway(self, port: int | None = None) -> Proc:
        self.gateway = start_gateway(self.tmp, self.config, self.env, port=port)
        return self.gateway

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for sim in self.sims:
            sim.stop()
        self.engine.dispose()


def make_stack(
    tmp: Path,
    database_url: str,
    *,
    replicas: int = 2,
    sim_args: tuple[str, ...] = INSTANT,
    deployment: dict[str, object] | None = None,
    start: bool = True,
    **env: str,
) -> FaultStack:
    """Migrate, price, a tenant and its key, ``replicas`` sims, and (``start``) the gateway."""
    full_env = gateway_env(database_url, tmp / "journal", **env)
    kvgate("db", "upgrade", env=full_env)
    kvgate("prices", "sync", env=full_env)
    key, _ = make_tenant(full_env, "faults")
    sims = [start_sim(tmp, extra=sim_args) for _ in range(replicas)]
    config = write_config(
        tmp / "kvgate.yaml",
        [{"name": MODEL, "replicas": [s.url for s in sims], **(deployment or {})}],
    )
    stack = FaultStack(tmp, database_url, full_env, key, sims, config, make_engine(database_url))
    if start:
        stack.start_gateway()
    return stack
