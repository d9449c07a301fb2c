"""A real stack on loopback: `kvgate sim` replicas, `kvgate serve`, tenants made by the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway.db.session import make_engine
from tests.conftest import _backends, new_database
from tests.support.processes import (
    Proc,
    free_port,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
    write_config,
)

MODEL = "kvgate/demo-llama-8b"
SOLO = "solo-llama"  # one replica: repeats always land on the same cache
DOWN = "down-llama"  # a replica nobody listens on
UNPRICED = "unpriced-llama"  # bills as a model the price book does not know


@dataclass
class Stack:
    url: str
    database_url: str
    engine: Engine
    env: dict[str, str]
    keys: dict[str, str]
    key_ids: dict[str, str]
    gateway: Proc
    sims: list[Proc]
    config: Path
    tmp: Path
    admin_token: str = "test-admin-token"
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


def make_tenant(env: dict[str, str], name: str) -> tuple[str, str]:
    """Tenant and key through the real CLI; the key is alone on the last line."""
    kvgate("tenants", "create", name, env=env)
    out = kvgate("keys", "create", "--tenant", name, env=env).stdout.strip().splitlines()
    key = out[-1]
    key_id = out[0].split()[1]
    assert key.startswith("kvg-") and " " not in key
    return key, key_id


@pytest.fixture(scope="module", params=_backends())
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    with new_database(request.param, tmp) as database_url:
        env = gateway_env(
            database_url,
            tmp / "journal",
            KVGATE_ADMIN_TOKEN="test-admin-token",
            KVGATE_MAX_BODY_BYTES="65536",
        )
        kvgate("db", "upgrade", env=env)
        kvgate("prices", "sync", env=env)
        keys, key_ids = {}, {}
        for name in ("alpha", "beta"):
            keys[name], key_ids[name] = make_tenant(env, name)
        sims = [start_sim(tmp), start_sim(tmp), start_sim(tmp)]
        config = write_config(
            tmp / "kvgate.yaml",
            [
                {"name": MODEL, "replicas": [sims[0].url, sims[1].url]},
                {
                    "name": SOLO,
                    "replicas": [sims[2].url],
                    "price_model": MODEL,
                    "upstream_model": MODEL,
                },
                {
                    "name": DOWN,
                    "replicas": [f"http://127.0.0.1:{free_port()}"],
                    "price_model": MODEL,
                    "upstream_model": MODEL,
                    "connect_timeout_s": 1,
                },
                {
                    "name": UNPRICED,
                    "replicas": [sims[2].url],
                    "price_model": "no-price-for-this",
                    "upstream_model": MODEL,
                },
            ],
        )
        gateway = start_gateway(tmp, config, env)
        engine = make_engine(database_url)
        try:
            yield Stack(
                url=gateway.url,
                database_url=database_url,
                engine=engine,
                env=env,
                keys=keys,
                key_ids=key_ids,
                gateway=gateway,
                sims=sims,
                config=config,
                tmp=tmp,
            )
        finally:
            gateway.stop()
            for sim in sims:
                sim.stop()
            engine.dispose()
