"""Reconciliation against the engine live: `kvgate serve` samples two `kvgate sim` replicas'
own counters, and `kvgate reconcile replicas` sets them against the records, to the token;
traffic the gateway never saw (sent to a replica directly) is drift, said by the CLI, a log
line and the gateway's metric."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import func, select

from gateway.db.models import ReplicaSampleRow, RequestRow
from gateway.db.session import session_factory
from tests.conftest import _backends, new_database
from tests.factories import vllm
from tests.support.processes import kvgate
from tests.support.stack import SIM_MODEL, Stack, running_stack

pytestmark = pytest.mark.e2e
MODEL = "counted"
SYSTEM = "You answer questions about counters, briefly and in full sentences. " * 10


@pytest.fixture(params=_backends())
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("reconcile")
    with (
        new_database(request.param, tmp) as database_url,
        running_stack(
            tmp,
            database_url,
            tenants=("acme",),
            KVGATE_REPLICA_SAMPLE_S="0.2",
            KVGATE_RECONCILE_WINDOW_S="1",
        ) as stack,
    ):
        sims = stack.start_sims(2)
        stack.configure(
            [
                vllm(
                    MODEL,
                    [sim.url for sim in sims],
                    tokenizer="kvgate-sim",
                    upstream_model=SIM_MODEL,
                    price_model=SIM_MODEL,
                )
            ]
        )
        stack.start_gateway()
        yield stack


def sampled_after(stack: Stack, moment: datetime, timeout_s: float = 10.0) -> None:
    """Wait until every replica has a sample taken after ``moment``."""
    deadline = time.monotonic() + timeout_s
    while True:
        with session_factory(stack.engine)() as session:
            latest = dict(
                session.execute(
                    select(
                        ReplicaSampleRow.upstream, func.max(ReplicaSampleRow.sampled_at)
                    ).group_by(ReplicaSampleRow.upstream)
                ).all()
            )
        if len(latest) == len(stack.sims) and all(at > moment for at in latest.values()):
            return
        assert time.monotonic() < deadline, f"no samples after {moment}: {latest}"
        time.sleep(0.1)


def test_recorded_tokens_equal_the_replicas_counters_and_unseen_traffic_is_drift(
    stack: Stack,
) -> None:
    since = datetime.now(UTC)
    sampled_after(stack, since)  # both replicas sampled before the traffic
    client = stack.client()
    for n in range(6):
        client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Question {n % 3}: what is counted?"},
            ],
            max_tokens=5,
        )
    rows = stack.rows(RequestRow.model == MODEL, count=6)
    sampled_after(stack, max(row.ended_at for row in rows))
    expected: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        expected[row.upstream]["prompt"] += row.uncached_tokens + row.cache_read_tokens
        expected[row.upstream]["cached"] += row.cache_read_tokens
        expected[row.upstream]["requests"] += 1
    assert sum(e["cached"] for e in expected.values()) > 0  # the repeats hit: it means something

    report = kvgate(
        "reconcile", "replicas", "--since", since.isoformat(), "--format", "json", env=stack.env
    )
    windows = json.loads(report.stdout)
    assert sorted(w["replica"] for w in windows) == sorted(stack.sim_urls)
    for window in windows:
        mine = expected.get(window["replica"], {"prompt": 0, "cached": 0, "requests": 0})
        assert window["requests"] == mine["requests"]
        assert window["prompt_tokens"] == {
            "recorded": mine["prompt"],
            "counted": mine["prompt"],
            "drift": None if not mine["prompt"] else "0.000000",
        }
        assert window["cached_tokens"]["recorded"] == window["cached_tokens"]["counted"]
        assert window["cached_tokens"]["recorded"] == mine["cached"]
        assert window["prefix_cache_queries"] == mine["prompt"]
        assert (window["restarted"], window["apart"]) == (False, [])

    # A request the gateway never saw: the replica counts it, kvgate has no record of it.
    offset = stack.log_size()
    direct_at = datetime.now(UTC)
    target = stack.sim_urls[0]
    answer = httpx.post(
        target + "/v1/completions",
        json={"model": SIM_MODEL, "prompt": "counted by the replica alone " * 20, "max_tokens": 2},
    ).json()
    unseen = answer["usage"]["prompt_tokens"]
    sampled_after(stack, datetime.now(UTC))
    later = json.loads(
        kvgate(
            "reconcile", "replicas", "--since", direct_at.isoformat(), "--replica", target,
            "--format", "json", env=stack.env,
        ).stdout
    )  # fmt: skip
    assert [(w["prompt_tokens"]["recorded"], w["prompt_tokens"]["counted"]) for w in later] == [
        (0, unseen)
    ]
    assert later[0]["apart"] == ["prompt"]
    # The gateway checks each closed window itself: a log line and its metric say so.
    deadline = time.monotonic() + 20
    series = f'kvgate_replica_drift_windows_total{{replica="{target}",tokens="prompt"}} '
    while series not in (exposition := httpx.get(stack.url + "/metrics").text):
        assert time.monotonic() < deadline, exposition[-2000:]
        time.sleep(0.2)
    assert float(exposition.split(series)[1].split()[0]) >= 1
    logged = stack.log_since(offset)
    assert f"replica {target}: prompt tokens " in logged
    assert f"kvgate recorded 0, the replica counted {unseen} (-100.00%)" in logged
