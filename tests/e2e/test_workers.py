"""`kvgate serve --workers 2`: two worker processes on one port that route as one.

Three `kvgate sim` replicas behind kv-aware routing with the sim's own tokenizer, so the
router's predictions are checked to the token. Every request opens its own connection,
so the kernel hands requests to either worker; a conversation's second turn must find
the replica its first turn filled whichever worker took each turn (without the workers'
shared routing knowledge, about one second turn in three lands blind on another replica:
tests/routing/test_peers.py shows that failure). Metrics are every worker's, summed.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from gateway.db.models import RequestRow
from tests.factories import vllm
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.e2e
SIM_MODEL = "kvgate/demo-llama-8b"
CONVERSATIONS = 16


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("workers")
    with running_stack(tmp, f"sqlite:///{tmp / 'kvgate.db'}", tenants=("workers",)) as stack:
        sims = stack.start_sims(3)
        stack.configure(
            [
                vllm(
                    "chat",
                    [s.url for s in sims],
                    policy="kv-aware",
                    tokenizer="kvgate-sim",
                    upstream_model=SIM_MODEL,
                    price_model=SIM_MODEL,
                )
            ]
        )
        stack.start_gateway(args=("--workers", "2"))
        yield stack


def ask(workers: Stack, messages: list[dict[str, str]]) -> None:
    # A client (and a connection) per request: the kernel picks the worker each time.
    with workers.client() as client:
        client.chat.completions.create(model="chat", max_tokens=4, messages=messages)  # type: ignore[arg-type]


def metrics(workers: Stack) -> str:
    with urllib.request.urlopen(workers.url + "/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def turn(n: int, turns: int) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Conversation {n}, question {t}. " * 30})
        if t < turns - 1:
            messages.append({"role": "assistant", "content": f"Answer {t} of {n}. " * 10})
    return messages


def test_two_workers_route_a_conversation_as_one_and_count_it_once(workers: Stack) -> None:
    for n in range(CONVERSATIONS):
        ask(workers, turn(n, 1))
        ask(workers, turn(n, 2))
    # /healthz answers for one worker: wait for both workers' writers in the database.
    deadline = time.monotonic() + 30
    while True:
        with workers.engine.connect() as connection:
            rows = list(
                connection.execute(select(RequestRow.__table__).order_by(RequestRow.started_at))
            )
        if len(rows) >= 2 * CONVERSATIONS or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(rows) == 2 * CONVERSATIONS and all(r.status == "completed" for r in rows)
    for first, second in zip(rows[0::2], rows[1::2], strict=True):
        # The second turn went where the first went, and the router knew what it would find
        # there to the token, whichever worker placed either turn.
        assert second.upstream == first.upstream
        assert second.cache_read_tokens > 0
        assert second.predicted_cached_tokens == second.cache_read_tokens
    time.sleep(1.5)  # every worker refreshes its gauges each second
    text = metrics(workers)
    served = sum(
        float(v)
        for v in re.findall(
            r'^kvgate_requests_total\{[^}]*status="completed"[^}]*\} (\S+)$', text, re.M
        )
    )
    assert served == 2 * CONVERSATIONS  # one scrape, both workers' counts
    sent = {
        pid: float(v)
        for pid, v in re.findall(
            r'^kvgate_peer_messages\{direction="sent",pid="(\d+)"\} (\S+)$', text, re.M
        )
    }
    assert len(sent) == 2 and all(v > 0 for v in sent.values()), sent  # both served
