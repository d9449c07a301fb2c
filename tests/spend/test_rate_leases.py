"""Rate limits admitted from leases (gateway/serving/rates.py on leases.py), in process on
real SQLite and Postgres: two workers on one database never admit more than a minute's
requests, whatever the concurrency; a steady-state admission and settlement make no
database round trip (statements counted on the engine); the next minute's slice is taken
before it begins, and the last minute's given back; an idle slice goes back; the headers
and refusals are the ones clients know."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from gateway.budgets import parse_scope
from gateway.db import spend
from gateway.db.session import session_factory, transaction
from gateway.errors import RateLimited
from gateway.serving import leases
from gateway.serving.admission import Admission, Admitted
from gateway.serving.leases import IDLE_S
from gateway.serving.rates import count_of
from tests.factories import Tenant, tenants
from tests.spend import workers as spend_workers
from tests.spend.workers import context

NOON = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)


@dataclass
class Clock:
    """The admissions' time: set by the test."""

    at: datetime = NOON

    def __call__(self) -> datetime:
        return self.at


def _set_limit(engine: Engine, requests: int | None, tokens: int | None = None) -> None:
    """Set (or change) tenant acme's rate limit."""
    with transaction(session_factory(engine)) as session:
        spend.set_limit(
            session,
            scope=parse_scope("tenant:acme"),
            requests_per_minute=requests,
            tokens_per_minute=tokens,
        )


def _limit(engine: Engine, requests: int | None, tokens: int | None = None) -> Tenant:
    """Tenant acme, limited."""
    [acme] = tenants(engine, "acme").values()
    _set_limit(engine, requests, tokens)
    return acme


class Statements:
    """Statements an engine runs, from any thread."""

    def __init__(self, engine: Engine) -> None:
        self.seen: list[str] = []
        self.engine = engine
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.seen.append(args[2])

    def take(self) -> list[str]:
        seen, self.seen = self.seen, []
        return seen


def _counter(engine: Engine, name: str, start: datetime) -> tuple[int, int]:
    """A minute's (count, held in slices), in requests or tokens."""
    with session_factory(engine)() as session:
        spent, reserved = spend.counter(session, name, start)
    return count_of(spent), count_of(reserved)


async def _statuses(worker: Admission, tenant: Tenant, numbers: range) -> list[int]:
    """Requests one after another: 200 for each admitted, 429 for each refused."""
    found = []
    for number in numbers:
        try:
            await worker.admit(context(tenant, number))
            found.append(200)
        except RateLimited:
            found.append(429)
    return found


def _tokens(admitted: Admitted, tokens: int) -> None:
    """As if the request's one record said it took ``tokens`` (prompt and output)."""
    admitted.tokens += tokens


def test_two_workers_never_admit_more_than_a_minutes_requests(engine: Engine) -> None:
    """200 requests at once over two workers sharing the database, 25 a minute: exactly 25
    admitted (both keep busy, so each uses all it holds), every other one a 429."""
    acme = _limit(engine, 25)
    clock = Clock()
    workers = [spend_workers.worker(engine, clock), spend_workers.worker(engine, clock)]

    async def one(number: int) -> int:
        try:
            await workers[number % 2].admit(context(acme, number))
        except RateLimited as refused:
            assert refused.headers["x-ratelimit-limit-requests"] == "25"
            return 429
        return 200

    async def run() -> list[int]:
        statuses = await asyncio.gather(*(one(n) for n in range(200)))
        for worker in workers:
            await worker.flush()
        return list(statuses)

    statuses = asyncio.run(run())
    assert (statuses.count(200), statuses.count(429)) == (25, 175)
    [limit] = workers[0].rules.limits
    requests, _ = spend.window_counters(limit.id)
    spent, reserved = _counter(engine, requests, NOON.replace(second=0))
    assert spent == 25 and spent + reserved <= 25


def test_a_steady_admission_makes_no_database_round_trip(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the worker holds its slices, 40 admissions and settlements run no statement.
    A flush writes a slice's spend once it is a quarter (``SPEND_SHARES``) of the slice
    (the 41 requests of a 50-request slice) or ``SPEND_FLUSH_S`` old (the 1,200 tokens
    of a 50,000 slice: not at the next tick, but once that time has passed)."""
    acme = _limit(engine, 1000, 1_000_000)
    clock = Clock()
    worker = spend_workers.worker(engine, clock)
    statements = Statements(engine)

    async def run() -> list[dict[str, str]]:
        await worker.admit(context(acme, 0))  # the first takes the slices: a sync each
        assert statements.take() != []
        headers = []
        for number in range(1, 41):
            admitted = await worker.admit(context(acme, number))
            _tokens(admitted, 30)
            await worker.settle(admitted)
            headers.append(admitted.headers)
        assert statements.take() == []
        await worker.flush()
        assert _counter(engine, tokens, minute)[0] == 0  # a quarter of its slice: not yet
        monkeypatch.setattr(leases, "SPEND_FLUSH_S", 0.0)  # as if a second had passed
        await worker.flush()
        return headers

    [limit] = worker.rules.limits
    requests, tokens = spend.window_counters(limit.id)
    minute = NOON.replace(second=0)
    headers = asyncio.run(run())
    assert [h["x-ratelimit-remaining-requests"] for h in headers[:3]] == ["998", "997", "996"]
    # Each request's headers count the tokens settled before it: 30 per request.
    assert [h["x-ratelimit-remaining-tokens"] for h in headers[:3]] == [
        "1000000",
        "999970",
        "999940",
    ]
    assert headers[0]["x-ratelimit-reset-requests"] == "30.000s"
    assert _counter(engine, requests, minute)[0] == 41
    assert _counter(engine, tokens, minute)[0] == 40 * 30


def test_the_next_minutes_slice_is_taken_before_it_begins(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker busy at 12:00:59.9 holds a slice of 12:01 by then: its first request at
    12:01 makes no round trip and counts in the new minute; 12:00's slice goes back."""
    monkeypatch.setattr(leases, "SPEND_FLUSH_S", 0.0)  # every flush writes the spend
    acme = _limit(engine, 10)
    clock = Clock(NOON.replace(second=59, microsecond=900_000))
    worker = spend_workers.worker(engine, clock)
    statements = Statements(engine)
    [limit] = worker.rules.limits
    requests, _ = spend.window_counters(limit.id)
    before, after = NOON.replace(second=0), NOON.replace(minute=1, second=0)

    async def run() -> Admitted:
        for number in range(10):
            await worker.admit(context(acme, number))
        with pytest.raises(RateLimited) as refused:
            await worker.admit(context(acme, 10))
        assert refused.value.headers["retry-after"] == "1"
        assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"
        await worker.flush()  # 0.1 s before 12:01: its slice is taken now
        clock.at = after + timedelta(milliseconds=50)
        statements.take()
        admitted = await worker.admit(context(acme, 11))
        assert statements.take() == []
        await worker.flush()
        return admitted

    admitted = asyncio.run(run())
    assert admitted.headers["x-ratelimit-remaining-requests"] == "9"
    assert admitted.headers["x-ratelimit-reset-requests"] == "59.950s"
    assert _counter(engine, requests, before) == (10, 0)
    spent, reserved = _counter(engine, requests, after)
    assert spent == 1 and 0 < reserved <= 9


def test_an_idle_slice_goes_back_to_the_minute(engine: Engine) -> None:
    """Unused for a second, a worker's slice is returned: another worker can admit the
    whole rest of the minute."""
    acme = _limit(engine, 20)
    clock = Clock()
    first, second = (spend_workers.worker(engine, clock) for _ in range(2))
    [limit] = first.rules.limits
    requests, _ = spend.window_counters(limit.id)
    minute = NOON.replace(second=0)

    async def run() -> list[int]:
        await first.admit(context(acme, 0))
        await first.flush()
        assert _counter(engine, requests, minute)[1] > 0  # held by the first worker
        time.sleep(IDLE_S + 0.1)
        await first.flush()
        assert _counter(engine, requests, minute) == (1, 0)
        return await _statuses(second, acme, range(1, 21))

    assert asyncio.run(run()) == [200] * 19 + [429]


def test_tokens_per_minute_count_when_settled_and_refuse_once_past(engine: Engine) -> None:
    """Tokens per minute: admitted while the worker's slice has tokens left; a request's
    tokens count when it is settled, so one in flight can take the minute past its cap,
    and the next is refused."""
    acme = _limit(engine, None, 100)
    worker = spend_workers.worker(engine, Clock())

    async def run() -> RateLimited:
        admitted = await worker.admit(context(acme, 0))
        assert "x-ratelimit-limit-requests" not in admitted.headers
        _tokens(admitted, 150)
        await worker.settle(admitted)
        with pytest.raises(RateLimited) as refused:
            await worker.admit(context(acme, 1))
        return refused.value

    refused = asyncio.run(run())
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    assert refused.message == "rate limit of tenant:acme reached for this minute; retry in 30 s"


def test_the_largest_caps_fit_their_counters(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10^9 requests and 10^15 tokens a minute (the most a limit takes): counted exactly in
    counters that hold money (Numeric(18, 9))."""
    monkeypatch.setattr(leases, "SPEND_FLUSH_S", 0.0)  # every flush writes the spend
    acme = _limit(engine, 10**9, 10**15)
    worker = spend_workers.worker(engine, Clock())

    async def run() -> dict[str, str]:
        admitted = await worker.admit(context(acme, 0))
        _tokens(admitted, 123_456_789)
        await worker.settle(admitted)
        await worker.flush()
        return (await worker.admit(context(acme, 1))).headers

    headers = asyncio.run(run())
    assert headers["x-ratelimit-remaining-requests"] == str(10**9 - 2)
    assert headers["x-ratelimit-remaining-tokens"] == str(10**15 - 123_456_789)
    [limit] = worker.rules.limits
    requests, tokens = spend.window_counters(limit.id)
    minute = NOON.replace(second=0)
    assert _counter(engine, requests, minute)[0] == 1
    assert _counter(engine, tokens, minute) == (123_456_789, 5 * 10**13)


def test_a_lowered_limit_applies_at_once_to_what_a_worker_holds(engine: Engine) -> None:
    """5 of 100 admitted, the worker holding more of the minute: lowered to 3, the next
    request is refused at once (the slice given back); raised to 7, two more get in."""
    acme = _limit(engine, 100)
    limits = spend_workers.limits_of(engine)
    worker = spend_workers.worker(engine, Clock(), limits)

    def set_cap(cap: int) -> None:
        _set_limit(engine, cap)
        limits.reload()

    async def run() -> None:
        assert await _statuses(worker, acme, range(5)) == [200] * 5
        await worker.flush()
        set_cap(3)
        assert await _statuses(worker, acme, range(5, 7)) == [429, 429]
        set_cap(7)
        assert await _statuses(worker, acme, range(7, 10)) == [200, 200, 429]
        await worker.flush()

    asyncio.run(run())
    [limit] = limits.value
    requests, _ = spend.window_counters(limit.id)
    spent, held = _counter(engine, requests, NOON.replace(second=0))
    assert spent == 7 and held == 0
