"""Reconciliation against the engine: what kvgate recorded of a few requests equals what the
replicas' own counters say (vllm:prompt_tokens, vllm:prefix_cache_hits), per replica, as
`kvgate reconcile replicas` reports it from the gateway's samples; real vLLM and the sim."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from gateway.db.models import ReplicaSampleRow
from tests.support.processes import kvgate
from tests.vllm.conftest import ExactStack
from tests.vllm.replicas import text


def sampled_after(stack: ExactStack, moment: datetime, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with stack.engine.connect() as connection:
            latest = dict(
                connection.execute(
                    select(
                        ReplicaSampleRow.upstream, func.max(ReplicaSampleRow.sampled_at)
                    ).group_by(ReplicaSampleRow.upstream)
                ).all()
            )
        urls = [r.url for r in stack.backend.replicas]
        if all(url in latest and latest[url] > moment for url in urls):
            return
        assert time.monotonic() < deadline, f"no samples after {moment}: {latest}"
        time.sleep(0.1)


def test_recorded_prompt_and_cached_tokens_equal_the_replicas_counters(
    stack: ExactStack,
) -> None:
    # A window begins at the replica's last sample before --since: wait for one taken after
    # every earlier test's requests, so that none of theirs falls in this test's windows.
    sampled_after(stack, datetime.now(UTC))
    since = datetime.now(UTC)
    sampled_after(stack, since)
    client = stack.client()
    system = {"role": "system", "content": text(211, 120)}
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for turn in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[system, {"role": "user", "content": text(turn % 2, 12)}],  # type: ignore[list-item]
            max_tokens=2,
            temperature=0,
        )
        row = stack.row(raw.headers["x-request-id"])
        expected[row.upstream][0] += row.uncached_tokens + row.cache_read_tokens
        expected[row.upstream][1] += row.cache_read_tokens
    assert sum(cached for _, cached in expected.values()) > 0
    # The replica updates its counters from its engine loop, a moment after answering.
    sampled_after(stack, datetime.now(UTC) + timedelta(seconds=1))
    windows = json.loads(
        kvgate(
            "reconcile", "replicas", "--since", since.isoformat(), "--format", "json",
            env=stack.env,
        ).stdout
    )  # fmt: skip
    found = {
        w["replica"]: [w["prompt_tokens"]["counted"], w["cached_tokens"]["counted"]]
        for w in windows
        if w["requests"]
    }
    recorded = {
        w["replica"]: [w["prompt_tokens"]["recorded"], w["cached_tokens"]["recorded"]]
        for w in windows
        if w["requests"]
    }
    assert recorded == dict(expected)
    assert found == dict(expected)
    assert all(w["apart"] == [] for w in windows)
