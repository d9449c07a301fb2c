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

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from gateway.db.models import RequestRow
from tests.factories import vllm
from tests.support.processes import start_sim, wait_http
from tests.support.stack import INSTANT, Stack, running_stack

pytestmark = pytest.mark.e2e
SIM_MODEL = "kvgate/demo-llama-8b"
SYSTEMS = [
    f"System prompt number {n}: you are assistant {n} of the routing test. " * 10 for n in range(8)
]


POLICIES = ("kv-aware", "round-robin")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Three replicas per policy (the first three kv-aware's), one tenant ``router``."""
    tmp = tmp_path_factory.mktemp("routing")
    with running_stack(
        tmp, f"sqlite:///{tmp / 'kvgate.db'}", tenants=("router",), KVGATE_HEALTH_INTERVAL_S="0.3"
    ) as stack:
        models = [
            vllm(
                policy,
                [sim.url for sim in stack.start_sims(3)],
                policy=policy,
                tokenizer="kvgate-sim",
                upstream_model=SIM_MODEL,
                price_model=SIM_MODEL,
                connect_timeout_s=1,
            )
            for policy in POLICIES
        ]
        stack.configure(models)
        stack.start_gateway()
        yield stack


def wait_in_rotation(fleet: Stack, url: str, timeout_s: float = 10.0) -> None:
    """Until the gateway's health checks (every 0.3 s here) have put the replica back in
    rotation, as its ``kvgate_replica_up`` gauge says (a fixed second was not always enough
    on a busy CI machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = httpx.get(fleet.url + "/metrics").text
        up = [
            line.rsplit(" ", 1)[1]
            for line in metrics.splitlines()
            if line.startswith("kvgate_replica_up{") and f'replica="{url}"' in line
        ]
        if up and all(float(value) == 1.0 for value in up):
            return
        assert time.monotonic() < deadline, f"{url} not back in rotation: {up}"
        time.sleep(0.1)


def rows_of(fleet: Stack, model: str) -> list[RequestRow]:
    return fleet.rows(RequestRow.model == model)


def run_workload(fleet: Stack, model: str) -> None:
    """8 shared system prompts, 6 distinct user turns each, interleaved."""
    client = OpenAI(base_url=fleet.base_url, api_key=fleet.key, max_retries=0)
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


def test_kv_aware_reaches_the_ceiling_and_round_robin_does_not(fleet: Stack) -> None:
    run_workload(fleet, "kv-aware")
    run_workload(fleet, "round-robin")
    kv_rows, rr_rows = rows_of(fleet, "kv-aware"), rows_of(fleet, "round-robin")
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


def test_a_stopped_replica_loses_no_request_and_is_no_longer_chosen(fleet: Stack) -> None:
    victim = fleet.sims[0]  # kv-aware's first
    errors: list[BaseException] = []
    done = 0
    killed_at: datetime | None = None

    async def load() -> None:
        nonlocal done, killed_at
        client = AsyncOpenAI(base_url=fleet.base_url, api_key=fleet.key, max_retries=0)

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
    rows = [r for r in rows_of(fleet, "kv-aware") if r.started_at >= killed_at]
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
    back = start_sim(fleet.tmp, port=port, extra=INSTANT)
    fleet.sims[0] = back
    wait_http(back.url + "/health")
    wait_in_rotation(fleet, back.url)
    client = OpenAI(base_url=fleet.base_url, api_key=fleet.key, max_retries=0)
    for n in range(12):
        client.chat.completions.create(
            model="kv-aware",
            max_tokens=2,
            messages=[
                {"role": "system", "content": f"A brand-new prompt {n} " * 30},
                {"role": "user", "content": "hi"},
            ],
        )
    recent = rows_of(fleet, "kv-aware")[-12:]
    assert any(r.upstream == back.url for r in recent)
