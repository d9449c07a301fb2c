"""Prefix breakers with `kvgate serve --workers 2`: every request opens its own connection,
so the kernel hands each turn to either worker; a turn's predecessor is found whichever
worker served it (the workers send each other every request's chain over the peers link).
Without that, about every second turn would land on the worker that never saw the turn
before it, and its break would go unrecorded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from gateway.db.models import RequestRow
from gateway.routing.sim_tokenizer import encode, render_chat
from tests.factories import vllm
from tests.support.stack import SIM_MODEL, Stack, running_stack

pytestmark = pytest.mark.e2e
INTERACTIONS = 12
STABLE = "You are the assistant of the two-worker test. " * 20


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("breakers-workers")
    with running_stack(tmp, f"sqlite:///{tmp / 'kvgate.db'}", tenants=("w",)) as stack:
        [sim] = stack.start_sims(1)
        stack.configure(
            [vllm("chat", [sim.url], tokenizer="kvgate-sim", upstream_model=SIM_MODEL,
                  price_model=SIM_MODEL)]
        )  # fmt: skip
        stack.start_gateway(args=("--workers", "2"))
        yield stack


def test_each_turns_break_is_found_whichever_worker_served_the_turn_before(
    workers: Stack,
) -> None:
    sent: dict[str, list[int]] = {}
    for n in range(INTERACTIONS):
        for question in ("First question?", "Second question?"):
            messages = [
                {"role": "system", "content": f"{datetime.now(UTC).isoformat()} {STABLE}"},
                {"role": "user", "content": f"Interaction {n}. {question}"},
            ]
            with workers.client() as client:  # a connection per request: either worker
                client.chat.completions.create(
                    model="chat",
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=2,
                    extra_headers={"x-interaction-id": f"i{n}"},
                )
            sent.setdefault(f"i{n}", []).append(len(encode(render_chat(messages))))
            time.sleep(0.02)  # a client reads its answer before it sends the next turn
    deadline = time.monotonic() + 30
    while True:
        with workers.engine.connect() as connection:
            rows = list(
                connection.execute(
                    select(
                        RequestRow.interaction_id, RequestRow.break_tokens, RequestRow.lost_tokens
                    ).order_by(RequestRow.started_at)
                )
            )
        if len(rows) >= 2 * INTERACTIONS or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    breaks = {i: (b, lost) for i, b, lost in rows if b is not None}
    assert breaks == {i: (0, tokens[0]) for i, tokens in sent.items()}
