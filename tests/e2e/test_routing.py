"""KV-aware routing live: three `kvgate sim` replicas behind `kvgate serve`.

The deployments use the sim's own tokenizer (``tokenizer: kvgate-sim``), so the router's
blocks are the replicas' blocks and its predictions can be checked to the token.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from openai import AsyncOpenAI, OpenAI
from sqlalchemy import select

from gateway.db.models import RequestRow
from gateway.db.session import make_engine
from tests.e2e.conftest import make_tenant
from tests.support.processes import (
    Proc,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
    wait_http,
    wait_recorded,
    write_config,
)

pytestmark = pytest.mark.e2e
SIM_MODEL = "kvgate/demo-llama-8b"
SYSTEMS = [
    f"System prompt number {n}: you are assistant {n} of the routing test. " * 10 for n in range(8)
]


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sims: dict[str, list[Proc]] = {}
        self.database_url = f"sqlite:///{tmp / 'kvgate.db'}"
        self.env = gateway_env(self.database_url, tmp / "journal", KVGATE_HEALTH_INTERVAL_S="0.3")
        kvgate("db", "upgrade", env=self.env)
        kvgate("prices", "sync", env=self.env)
        self.key, _ = make_tenant(self.env, "router")
        models = []
        for policy in ("kv-aware", "round-robin"):
            sims = [
                start_sim(tmp, extra=("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "0"))
                for _ in range(3)
            ]
            self.sims[policy] = sims
            models.append(
                {
                    "name": policy,
                    "replicas": [s.url for s in sims],
                    "policy": policy,
                    "tokenizer": "kvgate-sim",
                    "upstream_model": SIM_MODEL,
                    "price_model": SIM_MODEL,
                    "connect_timeout_s": 1,
                }
            )
        self.config = write_config(tmp / "kvgate.yaml", models)
        self.gateway = start_gateway(tmp, self.config, self.env)
        self.engine = make_engine(self.database_url)

    def rows(self, model: str) -> list[RequestRow]:
        wait_recorded(self.gateway.url)
        with self.engine.connect() as connection:
            return list(
                connection.execute(  # type: ignore[arg-type]
                    select(RequestRow)
                    .where(RequestRow.model == model)
                    .order_by(RequestRow.started_at)
                )
            )

    def stop(self) -> None:
        self.gateway.stop()
        for sims in self.sims.values():
            for sim in sims:
                sim.stop()
        self.engine.dispose()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    running = Fleet(tmp_path_factory.mktemp("routing"))
    yield running
    running.stop()


def run_workload(fleet: Fleet, model: str) -> None:
    """8 shared system prompts, 6 distinct user turns each, interleaved."""
    client = OpenAI(base_url=fleet.gateway.url + "/v1", api_key=fleet.key, max_retries=0)
    for turn in range(6):
        for n, system in enumerate(SYSTEMS):
            client.chat.completions.create(
                model=model,
                max_tokens=2,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"user {n} asks question {turn}"},
                ],
            )


def rates(rows: list[RequestRow]) -> tuple[float, float]:
    prompt = sum(r.uncached_tokens + r.cache_read_tokens for r in rows)
    return (
        sum(r.cache_read_tokens for r in rows) / prompt,
        sum(r.ceiling_cached_tokens or 0 for r in rows) / prompt,
    )


def test_kv_aware_reaches_the_ceiling_and_round_robin_does_not(fleet: Fleet) -> None:
    run_workload(fleet, "kv-aware")
    run_workload(fleet, "round-robin")
    kv_rows, rr_rows = fleet.rows("kv-aware"), fleet.rows("round-robin")
    assert len(kv_rows) == len(rr_rows) == 48
    kv_rate, kv_ceiling = rates(kv_rows)
    rr_rate, rr_ceiling = rates(rr_rows)
    assert kv_ceiling == rr_ceiling  # the same traffic has the same ceiling
    print(f"kv-aware {kv_rate:.4f} rr {rr_rate:.4f} ceiling {kv_ceiling:.4f}")
    assert kv_rate >= 0.9 * kv_ceiling
    assert rr_rate <= 0.75 * rr_ceiling
    # Exact mode: the router predicted every request's cached tokens to the token.
    assert [r.predicted_cached_tokens for r in kv_rows] == [r.cache_read_tokens for r in kv_rows]
    # Each system prompt stays on the replica that holds it (rows are turn-major: row i
    # carries system prompt i % 8); round-robin spreads each prompt over all three.
    for n in range(8):
        assert len({kv_rows[i].upstream for i in range(n, 48, 8)}) == 1
        assert len({rr_rows[i].upstream for i in range(n, 48, 8)}) == 3


def test_a_stopped_replica_loses_no_request_and_is_no_longer_chosen(fleet: Fleet) -> None:
    victim = fleet.sims["kv-aware"][0]
    errors: list[BaseException] = []
    done = 0
    killed_at: datetime | None = None

    async def load() -> None:
        nonlocal done, killed_at
        client = AsyncOpenAI(base_url=fleet.gateway.url + "/v1", api_key=fleet.key, max_retries=0)

        async def worker(n: int) -> None:
            nonlocal done
            for i in range(40):
                try:
                    await client.chat.completions.create(
                        model="kv-aware",
                        max_tokens=3,
                        messages=[
                            {"role": "system", "content": SYSTEMS[(n + i) % 8]},
                            {"role": "user", "content": f"failover {n} {i}"},
                        ],
                    )
                    done += 1
                except Exception as exc:
                    errors.append(exc)

        async def killer() -> None:
            nonlocal killed_at
            while done < 60:
                await asyncio.sleep(0.01)
            killed_at = datetime.now(UTC)
            victim.stop(signal.SIGKILL)

        await asyncio.gather(killer(), *(worker(n) for n in range(6)))
        await client.close()

    asyncio.run(load())
    assert errors == []
    assert done == 240
    assert killed_at is not None
    rows = [r for r in fleet.rows("kv-aware") if r.started_at >= killed_at]
    late = [
        r
        for r in rows
        if r.upstream == victim.url and (r.started_at - killed_at).total_seconds() > 1.0
    ]
    assert late == []
    failed = [r for r in rows if r.status == "failed"]
    print(f"failed attempts after the kill: {len(failed)}")
    assert all(r.upstream == victim.url for r in failed)
    # Every failed attempt was retried as attempt 2 of the same interaction, and completed.
    retried = {
        r.request_id.rsplit(".", 1)[0] for r in rows if r.attempt == 2 and r.status == "completed"
    }
    assert {r.request_id for r in failed} <= retried

    # The replica comes back on the same port: health checks bring it back into rotation.
    port = int(victim.url.rsplit(":", 1)[1])
    back = start_sim(
        fleet.tmp, port=port, extra=("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "0")
    )
    fleet.sims["kv-aware"][0] = back
    wait_http(back.url + "/health")
    time.sleep(1.0)
    client = OpenAI(base_url=fleet.gateway.url + "/v1", api_key=fleet.key, max_retries=0)
    for n in range(12):
        client.chat.completions.create(
            model="kv-aware",
            max_tokens=2,
            messages=[
                {"role": "system", "content": f"A brand-new prompt {n} " * 30},
                {"role": "user", "content": "hi"},
            ],
        )
    recent = fleet.rows("kv-aware")[-12:]
    assert any(r.upstream == back.url for r in recent)
