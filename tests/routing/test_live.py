"""Routing live, against real `kvgate sim` processes behind a real `kvgate serve`, in exact
mode (the replicas publish KV events):

- a burst: 16 requests sharing one new 4,000-token prefix, sent at once to a fresh fleet
  of 4, land on at most 2 replicas and compute the prefix at most twice (predict on
  route: before the first replica's KV events arrive, its siblings follow the placement);
- tiers: a replica with a host-memory tier serves an evicted prompt from there; the
  router predicts that hit exactly, and the record says which tier served it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from sqlalchemy import Engine, select

from gateway.db.models import RequestRow
from gateway.db.session import make_engine
from tests.factories import config_file
from tests.support.processes import (
    Proc,
    cli_tenant,
    free_port,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
    wait_recorded,
)
from tests.vllm.replicas import settle

pytestmark = pytest.mark.e2e
SIM_MODEL = "kvgate/demo-llama-8b"
BLOCK = 16


@dataclass
class Live:
    gateway: Proc
    engine: Engine
    key: str
    replicas: dict[str, list[tuple[str, str]]]  # model → (url, replay endpoint)

    def rows(self, ids: list[str]) -> list[RequestRow]:
        wait_recorded(self.gateway.url)
        with self.engine.connect() as connection:
            found = {
                row.request_id: row
                for row in connection.execute(  # type: ignore[call-overload]
                    select(RequestRow).where(RequestRow.request_id.in_(ids))
                )
            }
        return [found[i] for i in ids]


def sim_with_events(tmp: Path, name: str, *extra: str) -> tuple[Proc, dict[str, str]]:
    events, replay = free_port(), free_port()
    directory = tmp / name
    directory.mkdir()
    proc = start_sim(
        directory,
        model=SIM_MODEL,
        extra=(
            "--block-size",
            str(BLOCK),
            "--kv-events-endpoint",
            f"tcp://*:{events}",
            "--kv-events-replay-endpoint",
            f"tcp://127.0.0.1:{replay}",
            "--kv-events-topic",
            "kv",
            *extra,
        ),
    )
    source = {
        "endpoint": f"tcp://127.0.0.1:{events}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay}",
        "topic": "kv",
    }
    return proc, source


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("routing-live")
    database_url = f"sqlite:///{tmp / 'kvgate.db'}"
    env = gateway_env(database_url, tmp / "journal", KVGATE_LOAD_INTERVAL_S="3600")
    kvgate("db", "upgrade", env=env)
    kvgate("prices", "sync", env=env)
    key, _ = cli_tenant(env, "router")
    # Prefill takes time (10,000 tokens/s), so the burst's requests are all in flight at once.
    fleet = [sim_with_events(tmp, f"fleet{n}", "--decode-tokens-per-s", "0") for n in range(4)]
    tiered = sim_with_events(
        tmp,
        "tiered",
        "--capacity-blocks",
        "6",
        "--cpu-blocks",
        "64",
        "--cpu-block-ms",
        "1",
        "--prefill-tokens-per-s",
        "0",
        "--decode-tokens-per-s",
        "0",
    )
    common = {
        "tokenizer": "kvgate-sim",
        "block_size": BLOCK,
        "upstream_model": SIM_MODEL,
        "price_model": SIM_MODEL,
    }
    config = config_file(
        tmp / "kvgate.yaml",
        [
            {
                "name": "burst",
                "replicas": [p.url for p, _ in fleet],
                "kv_events": [s for _, s in fleet],
                **common,
            },
            {
                "name": "tiered",
                "replicas": [tiered[0].url],
                "kv_events": [tiered[1]],
                "capacity_blocks": 6,
                "cpu_blocks": 64,
                **common,
            },
        ],
    )
    gateway = start_gateway(tmp, config, env)
    engine = make_engine(database_url)
    replicas = {
        "burst": [(p.url, s["replay_endpoint"]) for p, s in fleet],
        "tiered": [(tiered[0].url, tiered[1]["replay_endpoint"])],
    }
    try:
        yield Live(gateway, engine, key, replicas)
    finally:
        gateway.stop()
        for proc, _ in [*fleet, tiered]:
            proc.stop()
        engine.dispose()


def words(seed: int, count: int) -> str:
    """Distinct words: the sim's tokenizer makes one token of each."""
    return " ".join(f"w{seed}x{i}" for i in range(count))


def test_a_burst_sharing_a_new_prefix_lands_on_at_most_two_replicas(live: Live) -> None:
    settle(live.gateway.url, "burst", live.replicas["burst"])  # events followed: exact mode
    prefix = f"Shared instructions: {words(1, 4000)}"

    async def send_all() -> list[str]:
        client = openai.AsyncOpenAI(
            base_url=live.gateway.url + "/v1", api_key=live.key, max_retries=0, timeout=60
        )
        try:

            async def one(n: int) -> str:
                raw = await client.chat.completions.with_raw_response.create(
                    model="burst",
                    max_tokens=1,
                    messages=[
                        {"role": "system", "content": prefix},
                        {"role": "user", "content": f"Task {n}: {words(100 + n, 20)}"},
                    ],
                )
                return raw.headers["x-request-id"]

            return list(await asyncio.gather(*(one(n) for n in range(16))))
        finally:
            await client.close()

    rows = live.rows(asyncio.run(send_all()))
    prompt_tokens = [r.uncached_tokens + r.cache_read_tokens for r in rows]
    print("replicas", [r.upstream for r in rows], "cached", [r.cache_read_tokens for r in rows])
    assert min(prompt_tokens) > 4000
    assert len({r.upstream for r in rows}) <= 2
    # A request that hit fewer than 4,000 tokens computed (some of) the prefix itself.
    assert sum(r.cache_read_tokens < 4000 for r in rows) <= 2


def test_a_prompt_evicted_to_host_memory_is_served_from_there_and_recorded_so(
    live: Live,
) -> None:
    client = openai.OpenAI(base_url=live.gateway.url + "/v1", api_key=live.key, max_retries=0)
    first = [{"role": "user", "content": f"First: {words(7, 100)}"}]
    other = [{"role": "user", "content": f"Other: {words(8, 100)}"}]
    ids = []
    for messages in (first, other, first):  # 6 GPU blocks: "other" pushes "first" down
        settle(live.gateway.url, "tiered", live.replicas["tiered"])
        raw = client.chat.completions.with_raw_response.create(
            model="tiered",
            max_tokens=1,
            messages=messages,  # type: ignore[arg-type]
        )
        ids.append(raw.headers["x-request-id"])
    rows = live.rows(ids)
    again = rows[2]
    usable = (again.uncached_tokens + again.cache_read_tokens - 1) // BLOCK * BLOCK
    assert again.cache_read_tokens == usable > 0
    assert (again.cache_read_host_tokens, again.cache_read_disk_tokens) == (usable, 0)
    assert again.predicted_cached_tokens == usable  # the events said where the blocks went
    assert (rows[0].cache_read_host_tokens, rows[0].cache_read_tokens) == (0, 0)
