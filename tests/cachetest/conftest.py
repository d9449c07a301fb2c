"""A simulated fleet behind a real `kvgate serve` for the cache test: two `kvgate sim`
replicas whose timing makes the cache plain in TTFT (prefill 20,000 uncached tokens/s, one
prefill at a time; instant decode, so TTFT is queueing + prefill) and whose caches are small
enough (640 blocks of 16 tokens each) for the eviction stage to find their size quickly.

Tenants: ``alpha`` and ``beta`` isolated (each its own cache scope), ``carol`` and ``dave``
put into one explicit sharing group by the operator (``kvgate tenants set-group``). The
database is prepared in-process through the functions the CLI calls (each CLI process
costs seconds on a busy 2-core machine); the operator's group change goes through the CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.db import crud
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from pricing.book import load_catalog
from tests.support.processes import (
    Proc,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
    write_config,
)

MODEL = "kvgate/demo-llama-8b"
CAPACITY_BLOCKS = 640
BLOCK_SIZE = 16
SIM_TIMING = (
    "--prefill-tokens-per-s",
    "20000",
    "--decode-tokens-per-s",
    "0",
    "--capacity-blocks",
    str(CAPACITY_BLOCKS),
    "--block-size",
    str(BLOCK_SIZE),
)


@dataclass
class Fleet:
    url: str
    keys: dict[str, str]
    gateway: Proc
    sims: list[Proc]
    env: dict[str, str]
    tmp: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("cachetest-fleet")
    database_url = f"sqlite:///{tmp / 'kvgate.db'}"
    env = gateway_env(database_url, tmp / "journal")
    keys = _tenants(database_url, ("alpha", "beta", "carol", "dave"))
    for name in ("carol", "dave"):
        kvgate("tenants", "set-group", name, "--cache-group", "shared-by-operator", env=env)
    sims = [start_sim(tmp, model=MODEL, extra=SIM_TIMING) for _ in range(2)]
    config = write_config(tmp / "kvgate.yaml", [{"name": MODEL, "replicas": [s.url for s in sims]}])
    gateway = start_gateway(tmp, config, env)
    try:
        yield Fleet(gateway.url, keys, gateway, sims, env, tmp)
    finally:
        gateway.stop()
        for sim in sims:
            sim.stop()


def _tenants(database_url: str, names: tuple[str, ...]) -> dict[str, str]:
    """Migrations, the price catalog, and a tenant with one key for each name."""
    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with transaction(session_factory(engine)) as session:
            crud.add_prices(session, prices=load_catalog())
            for name in names:
                crud.create_tenant(session, name=name)
        with transaction(session_factory(engine)) as session:
            return {name: crud.create_key(session, tenant_name=name).key for name in names}
    finally:
        engine.dispose()


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float


def cachetest(*args: str, timeout_s: float = 240.0) -> Run:
    """The real command (``python -m gateway.cli cachetest``), timed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "cachetest", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout_s,
    )
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
