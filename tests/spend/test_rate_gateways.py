"""Rate limits across gateways, live on Postgres: two `kvgate serve` processes (journals of
their own, one database) admit a minute's requests from their leases. Under 64
concurrent clients the minute admits exactly its cap, the records agree, and once the
gateways are idle no slice of it is held; a killed gateway's slice returns after the
hold TTL, and the other gateway admits exactly the rest of the minute."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import func, select

from gateway.db import spend
from gateway.db.models import RequestRow
from gateway.db.session import session_factory
from gateway.serving.rates import count_of
from tests.conftest import new_database
from tests.factories import vllm
from tests.support.processes import Proc, gateway_env, start_gateway, wait_recorded
from tests.support.stack import SIM_MODEL, Stack, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]
ADMIN = "test-admin-token"


@contextmanager
def _two_gateways(tmp_path: Path, **env: str) -> Iterator[tuple[Stack, Proc, Proc]]:
    """A sim and two gateways on one new Postgres database, tenant ``rated``."""
    env = {"KVGATE_ADMIN_TOKEN": ADMIN, **env}
    with (
        new_database("postgres", tmp_path) as url,
        running_stack(tmp_path, url, tenants=("rated",), **env) as stack,
    ):
        stack.start_sims(1)
        stack.configure([vllm(SIM_MODEL, stack.sim_urls)])
        a = stack.start_gateway()
        assert stack.config is not None
        b = start_gateway(tmp_path, stack.config, gateway_env(url, tmp_path / "journal-b", **env))
        try:
            yield stack, a, b
        finally:
            b.stop()


def _one_minute_ahead(seconds: int) -> datetime:
    """Wait, if need be, so that ``seconds`` of work fit in the current minute; its start."""
    if datetime.now(UTC).second > 59 - seconds:
        time.sleep(61 - datetime.now(UTC).second)
    return datetime.now(UTC).replace(second=0, microsecond=0)


def _set_limit(url: str, requests_per_minute: int) -> str:
    reply = httpx.post(
        url + "/v1/admin/limits",
        json={"scope": "tenant:rated", "requests_per_minute": requests_per_minute},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert reply.status_code == 201, reply.text
    requests, _ = spend.window_counters(reply.json()["id"])
    return requests


def _asker(url: str, key: str) -> Callable[[int], int]:
    api = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)

    def ask(number: int) -> int:
        try:
            api.chat.completions.create(
                model=SIM_MODEL,
                messages=[{"role": "user", "content": f"request {number}"}],
                max_tokens=4,
            )
        except openai.RateLimitError as refused:
            assert refused.response.headers["x-ratelimit-limit-requests"] in ("40", "10")
            return 429
        return 200

    return ask


def _counter(engine: Any, name: str, start: datetime) -> tuple[int, int]:
    """A minute's (requests counted, requests held in slices)."""
    with session_factory(engine)() as session:
        spent, reserved = spend.counter(session, name, start)
    return count_of(spent), count_of(reserved)


def test_two_gateways_admit_exactly_a_minutes_requests_under_load(tmp_path: Path) -> None:
    with _two_gateways(tmp_path) as (stack, a, b):
        counter = _set_limit(a.url, 40)
        minute = _one_minute_ahead(25)
        asks = [_asker(a.url, stack.key), _asker(b.url, stack.key)]
        with ThreadPoolExecutor(64) as pool:
            outcomes = Counter(pool.map(lambda n: asks[n % 2](n), range(320)))
        # Both gateways kept busy: each used what it held. One more on each, in turn,
        # until both refuse in a row: nothing of the minute is left anywhere.
        refusals_in_a_row = 0
        for number in range(320, 400):
            outcome = asks[number % 2](number)
            outcomes[outcome] += 1
            refusals_in_a_row = refusals_in_a_row + 1 if outcome == 429 else 0
            if refusals_in_a_row == 2:
                break
        assert refusals_in_a_row == 2
        assert datetime.now(UTC).replace(second=0, microsecond=0) == minute
        assert outcomes[200] == 40, outcomes
        wait_recorded(a.url)
        wait_recorded(b.url)
        # Idle for a second, each gateway gives back what it held of the minute.
        deadline = time.monotonic() + 5
        while _counter(stack.engine, counter, minute)[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _counter(stack.engine, counter, minute) == (40, 0)
        with session_factory(stack.engine)() as session:
            statuses = dict(
                session.execute(
                    select(RequestRow.status, func.count()).group_by(RequestRow.status)
                ).all()
            )
        assert statuses == {"completed": 40, "refused": outcomes[429]}


def test_thirty_requests_at_once_over_two_gateways_admit_exactly_ten(tmp_path: Path) -> None:
    with _two_gateways(tmp_path) as (stack, a, b):
        _set_limit(a.url, 10)
        _one_minute_ahead(15)
        asks = [_asker(a.url, stack.key), _asker(b.url, stack.key)]
        with ThreadPoolExecutor(30) as pool:
            statuses = Counter(pool.map(lambda n: asks[n % 2](n), range(30)))
        assert statuses == {200: 10, 429: 20}


def test_a_killed_gateways_slice_of_the_minute_returns_after_the_ttl(tmp_path: Path) -> None:
    """Killed holding most of the minute, a gateway's slice is swept by the other within
    the TTL (1 s) and a sweep's interval; that one then admits exactly the rest."""
    with _two_gateways(tmp_path, KVGATE_BUDGET_HOLD_TTL_S="1") as (stack, a, b):
        counter = _set_limit(a.url, 10)
        minute = _one_minute_ahead(15)
        assert _asker(a.url, stack.key)(0) == 200
        # Flushed (within SPEND_FLUSH_S, 1 s): the request is counted, the slice topped up.
        deadline = time.monotonic() + 3
        while (spent_held := _counter(stack.engine, counter, minute))[0] < 1:
            assert time.monotonic() < deadline, spent_held
            time.sleep(0.05)
        spent, held = spent_held
        assert (spent, held) == (1, 8)  # 8 requests: a slice's least
        os.killpg(a.process.pid, signal.SIGKILL)
        a.process.wait()
        killed = time.monotonic()
        while _counter(stack.engine, counter, minute)[1] and time.monotonic() - killed < 10:
            time.sleep(0.05)
        returned_s = time.monotonic() - killed
        assert _counter(stack.engine, counter, minute) == (1, 0)
        assert returned_s < 1 + 1 / 3 + 1.5, returned_s  # TTL, a sweep interval, slack
        ask = _asker(b.url, stack.key)
        assert [ask(n) for n in range(1, 12)] == [200] * 9 + [429] * 2
        assert datetime.now(UTC).replace(second=0, microsecond=0) == minute
        assert "returned 1 budget hold(s)" in b.output()
