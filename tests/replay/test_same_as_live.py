"""`kvgate replay` runs the gateway's own placement: one request sequence, sent through a
real `kvgate serve` to three real `kvgate sim` replicas and replayed offline against three
simulated replicas of the same cache size, goes to the same replica request by request,
with the same predicted cached tokens (and the same cached tokens).

The sequence is built to exercise the bookkeeping: three shared system prompts, eight
conversations growing turn by turn, one-off prompts in between, 32 blocks per replica so
that caches evict. The deployment believes the replicas hold 48 blocks, so the router
predicts blocks the caches have evicted and learns of it from the replies: prediction
and learning both run on both sides (the replay told the same 48). Both sides are made
deterministic: requests one at a time with instant timing, the replicas' load readings
not polled mid-run, and the replay given the live request ids (policies break ties by
the request id's hash and the replica's name, so the replay names replicas by URL).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from openai import OpenAI
from sqlalchemy import select

from gateway.db.models import RequestRow
from gateway.db.session import make_engine
from gateway.routing.sim_tokenizer import encode, render_chat
from gateway.tools.replay.offline import ReplayConfig, replay
from gateway.tools.replay.trace import TraceRequest
from gateway.tools.sim.hashing import block_hashes
from gateway.tools.sim.timing import TimingModel
from pricing.book import load_catalog
from tests.factories import config_file, prepared_database
from tests.support.processes import (
    Proc,
    gateway_env,
    start_gateway,
    start_sim,
    wait_recorded,
)

pytestmark = pytest.mark.e2e
SIM_MODEL = "kvgate/demo-llama-8b"
BLOCK = 16
CAPACITY_BLOCKS = 32
BELIEVED_BLOCKS = 48  # the deployment's capacity_blocks: more than the sims hold
MAX_NUM_SEQS = 8
INSTANT = ("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "0")


def words(seed: int, count: int) -> str:
    """Distinct, deterministic words (the sim's tokenizer: one token per word)."""
    return " ".join(f"w{seed}x{i}" for i in range(count))


def sequence() -> list[list[dict[str, str]]]:
    """40 chats: 4 rounds of 8 growing conversations, 2 one-off prompts after each round."""
    systems = [f"System prompt {n}: {words(1000 + n, 70)}" for n in range(3)]
    chats: list[list[dict[str, str]]] = []
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": systems[c % 3]}] for c in range(8)
    ]
    for turn in range(4):
        for c, history in enumerate(histories):
            history.append(
                {"role": "user", "content": f"Question {turn}: {words(c * 10 + turn, 20)}"}
            )
            chats.append(list(history))
            history.append(
                {"role": "assistant", "content": f"Answer: {words(500 + c * 10 + turn, 12)}"}
            )
        for k in range(2):
            chats.append(
                [
                    {
                        "role": "user",
                        "content": f"One-off {turn}.{k}: {words(900 + turn * 2 + k, 150)}",
                    }
                ]
            )
    return chats


@dataclass(frozen=True)
class Live:
    request_id: str
    upstream: str
    prompt_tokens: int
    predicted_cached_tokens: int
    cached_tokens: int


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Live], list[str]]]:
    """The sequence through the gateway, one request at a time, as recorded."""
    tmp = tmp_path_factory.mktemp("same-as-live")
    database_url = f"sqlite:///{tmp / 'kvgate.db'}"
    # No load readings after start: every reading would be of an idle replica anyway,
    # but one taken mid-request would count a request the replay does not see.
    env = gateway_env(database_url, tmp / "journal", KVGATE_LOAD_INTERVAL_S="3600")
    key = prepared_database(database_url, "replayer", prices=load_catalog())["replayer"].key
    extra = (*INSTANT, "--capacity-blocks", str(CAPACITY_BLOCKS), "--block-size", str(BLOCK))
    sims: list[Proc] = [
        start_sim(tmp, extra=(*extra, "--max-num-seqs", str(MAX_NUM_SEQS))) for _ in range(3)
    ]
    config = config_file(
        tmp / "kvgate.yaml",
        [
            {
                "name": "chat",
                "replicas": [s.url for s in sims],
                "policy": "kv-aware",
                "tokenizer": "kvgate-sim",
                "block_size": BLOCK,
                "capacity_blocks": BELIEVED_BLOCKS,
                "max_num_seqs": MAX_NUM_SEQS,
                "upstream_model": SIM_MODEL,
                "price_model": SIM_MODEL,
            }
        ],
    )
    gateway = start_gateway(tmp, config, env)
    engine = make_engine(database_url)
    try:
        client = OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
        ids = []
        for messages in sequence():
            raw = client.chat.completions.with_raw_response.create(
                model="chat",
                max_tokens=1,
                messages=messages,  # type: ignore[arg-type]
            )
            ids.append(raw.headers["x-request-id"])
        wait_recorded(gateway.url)
        with engine.connect() as connection:
            rows = {
                row.request_id: row
                for row in connection.execute(select(RequestRow))  # type: ignore[arg-type]
            }
        yield (
            [
                Live(
                    request_id=i,
                    upstream=rows[i].upstream,
                    prompt_tokens=rows[i].uncached_tokens + rows[i].cache_read_tokens,
                    predicted_cached_tokens=rows[i].predicted_cached_tokens,
                    cached_tokens=rows[i].cache_read_tokens,
                )
                for i in ids
            ],
            [s.url for s in sims],
        )
    finally:
        gateway.stop()
        for sim in sims:
            sim.stop()
        engine.dispose()


def trace(ids: list[str]) -> list[TraceRequest]:
    """The same sequence as a trace: the sim's tokens, its blocks numbered as they appear."""
    numbers: dict[bytes, int] = {}
    out = []
    for n, (messages, request_id) in enumerate(zip(sequence(), ids, strict=True)):
        tokens = encode(render_chat(messages))
        blocks = [numbers.setdefault(h, len(numbers)) for h in block_hashes(tokens, BLOCK)]
        out.append(TraceRequest(n * 1000, len(tokens), 1, tuple(blocks), request_id=request_id))
    return out


def test_replay_places_every_request_where_the_gateway_did(
    live: tuple[list[Live], list[str]],
) -> None:
    records, urls = live
    requests = trace([r.request_id for r in records])
    config = ReplayConfig(
        replicas=3,
        capacity_blocks=CAPACITY_BLOCKS,
        block_tokens=BLOCK,
        timing=TimingModel(
            prefill_tokens_per_s=0, decode_tokens_per_s=0, max_num_seqs=MAX_NUM_SEQS
        ),
        replica_names=tuple(urls),
        index_capacity_blocks=BELIEVED_BLOCKS,
    )
    outcomes = replay(requests, "kv-aware", config).outcomes
    assert [r.prompt_tokens for r in records] == [o.prompt_tokens for o in outcomes]
    assert [r.upstream for r in records] == [urls[o.replica] for o in outcomes]
    assert [r.predicted_cached_tokens for r in records] == [
        o.predicted_cached_tokens for o in outcomes
    ]
    assert [r.cached_tokens for r in records] == [o.cached_tokens for o in outcomes]


def test_the_sequence_is_rich_enough_to_tell(live: tuple[list[Live], list[str]]) -> None:
    """More than one replica is chosen, prefixes are predicted and hit, caches evict, and
    the router is wrong about some of it (and learns)."""
    records, urls = live
    # Not necessarily all three: ties are broken by the request ids' hashes, new each run,
    # and a run in CI put the 40 requests on two of them (replay agreed, request by request).
    assert len({r.upstream for r in records}) >= 2
    assert {r.upstream for r in records} <= set(urls)
    predicted = [r.predicted_cached_tokens for r in records]
    cached = [r.cached_tokens for r in records]
    assert sum(c > 0 for c in cached) >= 20
    blocks = {b for t in trace([r.request_id for r in records]) for b in t.hash_ids}
    assert len(blocks) > 3 * CAPACITY_BLOCKS
    # Request ids (the policy's tie-break keys) are new each run, so which turns the router
    # gets wrong varies; that it gets some wrong, and replay agrees, is what matters.
    assert sum(p > c for p, c in zip(predicted, cached, strict=True)) >= 1
