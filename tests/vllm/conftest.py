"""Two replicas with KV events behind a real `kvgate serve`, in exact mode, twice over:
two `kvgate sim` processes (fast, unmarked) and two real vLLM servers on the CPU serving
the tiny local model (marker ``vllm``; ``pytest -m vllm`` runs just those).

The gateway has two deployments over the same replicas: ``tiny`` (both, kv-aware) and
``tiny-solo`` (the first only, so that isolation tests know where a prompt's blocks are).
Both hash prompts as the replicas do (the sims' tokenizer, or the tiny model's own) and
follow the replicas' KV events. Tenants ``alpha`` and ``beta`` have a key each.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import Engine, select

from gateway.db.models import RequestRow
from gateway.db.session import make_engine
from pricing.book import load_catalog
from tests.factories import config_file, prepared_database
from tests.support.processes import Proc, free_port, gateway_env, start_gateway, start_sim
from tests.support.tiny_model import build_tiny_model
from tests.support.vllm import (
    BLOCK_SIZE,
    SERVED_NAME,
    VllmServer,
    launch_vllm,
    restart,
    wait_ready,
)

PRICED_AS = "kvgate/demo-llama-8b"  # a model the price book knows
NUM_BLOCKS = 48  # per replica: 1,536 tokens, so that a few long prompts evict


@dataclass
class Replica:
    """One replica, sim or vLLM, as the tests see it."""

    url: str
    events_endpoint: str
    replay_endpoint: str
    restart: Callable[[], None]
    stop: Callable[[], None]


@dataclass
class Backend:
    kind: str  # "sim" or "vllm"
    tokenizer: str  # the deployments' tokenizer setting
    replicas: list[Replica]
    started_s: float


@dataclass
class ExactStack:
    backend: Backend
    gateway: Proc
    engine: Engine
    env: dict[str, str]
    keys: dict[str, str]
    tmp: Path
    extra: dict[str, object] = field(default_factory=dict)

    def client(self, tenant: str = "alpha") -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.gateway.url + "/v1", api_key=self.keys[tenant], max_retries=0
        )

    def row(self, request_id: str, timeout_s: float = 5.0) -> RequestRow:
        """The request's record, once the recorder has written it."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.engine.connect() as connection:
                found = connection.execute(  # type: ignore[call-overload]
                    select(RequestRow).where(RequestRow.request_id == request_id)
                ).first()
            if found is not None:
                return found  # type: ignore[no-any-return]
            if time.monotonic() > deadline:
                raise AssertionError(f"no record for {request_id}")
            time.sleep(0.05)

    def statement(self, key: str, via: str | None = None) -> dict[str, Any]:
        """Today's billing statement of the key's tenant, through the gateway (or ``via``
        another one on the same database)."""
        today = datetime.now(UTC).date()
        request = urllib.request.Request(
            f"{via or self.gateway.url}/v1/billing/statement?start={today}&end={today}",
            headers={"Authorization": f"Bearer {key}"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())  # type: ignore[no-any-return]


def _sim_backend(tmp: Path) -> Backend:
    started = time.monotonic()
    replicas: list[Replica] = []
    for n in range(2):
        port, events, replay = free_port(), free_port(), free_port()
        extra = (
            "--block-size",
            str(BLOCK_SIZE),
            "--capacity-blocks",
            str(NUM_BLOCKS),
            "--prefill-tokens-per-s",
            "0",
            "--decode-tokens-per-s",
            "0",
            "--max-model-len",
            "1024",
            "--kv-events-endpoint",
            f"tcp://*:{events}",
            "--kv-events-replay-endpoint",
            f"tcp://127.0.0.1:{replay}",
            "--kv-events-topic",
            "kv",
        )
        directory = tmp / f"sim{n}"
        directory.mkdir()
        holder: dict[str, Proc] = {
            "proc": start_sim(directory, model=SERVED_NAME, extra=extra, port=port)
        }

        def again(
            holder: dict[str, Proc] = holder,
            extra: tuple[str, ...] = extra,
            port: int = port,
            directory: Path = directory,
        ) -> None:
            holder["proc"].stop(signal.SIGKILL)
            holder["proc"] = start_sim(directory, model=SERVED_NAME, extra=extra, port=port)

        replicas.append(
            Replica(
                holder["proc"].url,
                f"tcp://127.0.0.1:{events}",
                f"tcp://127.0.0.1:{replay}",
                again,
                lambda holder=holder: holder["proc"].stop(),
            )
        )  # type: ignore[misc]
    return Backend("sim", "kvgate-sim", replicas, time.monotonic() - started)


def _vllm_backend(tmp: Path) -> Backend:
    started = time.monotonic()
    model = build_tiny_model(tmp / "tiny-model")
    launched = [launch_vllm(tmp / f"vllm{n}", model, num_blocks=NUM_BLOCKS) for n in range(2)]
    try:
        servers = [wait_ready(server) for server in launched]
    except Exception:
        for server in launched:
            server.stop()
        raise
    replicas: list[Replica] = []
    for server in servers:
        holder: dict[str, VllmServer] = {"server": server}

        def again(holder: dict[str, VllmServer] = holder) -> None:
            holder["server"] = restart(holder["server"])

        replicas.append(
            Replica(
                server.url,
                server.events_endpoint,
                server.replay_endpoint,
                again,
                lambda holder=holder: holder["server"].stop(),
            )
        )  # type: ignore[misc]
    return Backend("vllm", str(model), replicas, time.monotonic() - started)


@pytest.fixture(scope="session", params=["sim", pytest.param("vllm", marks=pytest.mark.vllm)])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    tmp = tmp_path_factory.mktemp(f"backend-{request.param}")
    running = _sim_backend(tmp) if request.param == "sim" else _vllm_backend(tmp)
    try:
        yield running
    finally:
        for replica in running.replicas:
            replica.stop()


@pytest.fixture(scope="session")
def stack(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExactStack]:
    tmp = tmp_path_factory.mktemp(f"exact-{backend.kind}")
    database_url = f"sqlite:///{tmp / 'kvgate.db'}"
    env = gateway_env(
        database_url,
        tmp / "journal",
        KVGATE_HEALTH_INTERVAL_S="0.3",
        KVGATE_LOAD_INTERVAL_S="0.3",
        KVGATE_REPLICA_SAMPLE_S="0.3",  # reconciliation's samples (test_reconcile.py)
        KVGATE_LOG_LEVEL="info",
    )
    made = prepared_database(database_url, "alpha", "beta", prices=load_catalog())
    keys = {name: tenant.key for name, tenant in made.items()}
    replicas = backend.replicas

    def events(chosen: list[Replica]) -> list[dict[str, str]]:
        return [
            {"endpoint": r.events_endpoint, "replay_endpoint": r.replay_endpoint, "topic": "kv"}
            for r in chosen
        ]

    common = {
        "upstream_model": SERVED_NAME,
        "price_model": PRICED_AS,
        "tokenizer": backend.tokenizer,
        "connect_timeout_s": 2,
    }
    config = config_file(
        tmp / "kvgate.yaml",
        [
            {
                "name": "tiny",
                "replicas": [r.url for r in replicas],
                "kv_events": events(replicas),
                **common,
            },
            {
                "name": "tiny-solo",
                "replicas": [replicas[0].url],
                "kv_events": events(replicas[:1]),
                **common,
            },
        ],
    )
    gateway = start_gateway(tmp, config, env)
    engine = make_engine(database_url)
    try:
        yield ExactStack(backend, gateway, engine, env, keys, tmp)
    finally:
        gateway.stop()
        engine.dispose()
