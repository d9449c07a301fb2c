"""No overspend under concurrency, across gateways: two `kvgate serve` processes (journals
of their own, one Postgres), 64 concurrent clients of one tenant (half of them streaming)
against a small daily budget, each gateway restarted in turn mid-run. Every request
completes or gets 402 (a client that finds its gateway down goes to the other); the settled
spend stays within the limit and equals, to the nano-dollar, the sum of the records' costs
in the period; no budget slice is held once the gateways are idle.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import openai
import pytest
from sqlalchemy import func, select

from gateway.budgets import Period, period_bounds
from gateway.db.models import BudgetAlertRow, BudgetCounterRow, BudgetHoldRow, RequestRow
from gateway.db.session import session_factory
from tests.conftest import new_database
from tests.factories import vllm
from tests.support.processes import gateway_env, kvgate, start_gateway, wait_recorded
from tests.support.stack import SIM_MODEL, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]
ADMIN = "test-admin-token"
CLIENTS = 64
LIMIT = Decimal("0.003000000")  # a few seconds of this traffic: exhausted during the restarts


def test_two_gateways_never_overspend_one_budget_through_restarts(tmp_path: Path) -> None:
    with (
        new_database("postgres", tmp_path) as url,
        running_stack(tmp_path, url, tenants=("small",), KVGATE_ADMIN_TOKEN=ADMIN) as stack,
    ):
        stack.start_sims(2, extra=("--decode-tokens-per-s", "400"))
        stack.configure([vllm(SIM_MODEL, stack.sim_urls)])
        a = stack.start_gateway()
        env_b = gateway_env(url, tmp_path / "journal-b", KVGATE_ADMIN_TOKEN=ADMIN)
        assert stack.config is not None
        config = stack.config
        b = start_gateway(tmp_path, config, env_b)
        gateways = {"a": a, "b": b}
        try:
            reply = httpx.post(
                a.url + "/v1/admin/budgets",
                json={"scope": "tenant:small", "limit": str(LIMIT), "period": "day"},
                headers={"authorization": f"Bearer {ADMIN}"},
            )
            assert reply.status_code == 201, reply.text
            budget_id = reply.json()["id"]
            outcomes: Counter[str] = Counter()
            lock = threading.Lock()
            restarted = threading.Event()

            def restart() -> None:
                """Each gateway in turn: SIGTERM, then a new process on its port and journal."""
                for name, env in (("a", stack.env), ("b", env_b)):
                    time.sleep(1.0)
                    old = gateways[name]
                    old.stop()
                    port = int(old.url.rsplit(":", 1)[1])
                    gateways[name] = start_gateway(tmp_path, config, env, port=port)
                    stack.others.append(gateways[name])  # stopped with the stack
                restarted.set()

            def ask(number: int, turn: int) -> str:
                """One request; a gateway found down (refused before any byte) is the other's."""
                messages = [{"role": "user", "content": f"client {number} turn {turn}"}]
                for attempt in range(40):
                    gateway = gateways[("a", "b")[(number + attempt) % 2]]
                    api = openai.OpenAI(
                        base_url=gateway.url + "/v1", api_key=stack.key, max_retries=0
                    )
                    try:
                        if (number + turn) % 2:
                            chunks = api.chat.completions.create(
                                model=SIM_MODEL, messages=messages, max_tokens=16, stream=True
                            )
                            # Read to the end: a client leaving early is a cancelled request.
                            read = list(chunks)
                            assert any(c.choices and c.choices[0].delta.content for c in read)
                        else:
                            api.chat.completions.create(
                                model=SIM_MODEL, messages=messages, max_tokens=16
                            )
                        return "completed"
                    except openai.APIConnectionError:
                        time.sleep(0.05)
                    except openai.APIStatusError as exc:
                        return str(exc.status_code)
                return "unreachable"

            def client(number: int) -> None:
                turn = 0
                deadline = time.monotonic() + 90
                # Until both restarts are done and the budget has refused this client.
                while time.monotonic() < deadline:
                    outcome = ask(number, turn)
                    turn += 1
                    with lock:
                        outcomes[outcome] += 1
                    if restarted.is_set() and outcome == "402":
                        return

            restarter = threading.Thread(target=restart)
            restarter.start()
            with ThreadPoolExecutor(CLIENTS) as pool:
                list(pool.map(client, range(CLIENTS)))
            restarter.join()
            # The clients stopped at their first 402, each on its own gateway: the other
            # may hold a slice it never used. Once idle slices are back (1 s), one client
            # alternates gateways until both refuse in a row: the budget is spent out.
            time.sleep(1.5)
            refusals_in_a_row = 0
            for turn in range(400):
                outcome = ask(turn, 10_000)
                outcomes[outcome] += 1
                refusals_in_a_row = refusals_in_a_row + 1 if outcome == "402" else 0
                if refusals_in_a_row == 2:
                    break
            assert refusals_in_a_row == 2
            assert set(outcomes) == {"completed", "402"}, outcomes
            wait_recorded(gateways["a"].url)
            wait_recorded(gateways["b"].url)
        finally:
            gateways["b"].stop()
        start, end = period_bounds(Period.DAY, ZoneInfo("UTC"), datetime.now(UTC))
        # B gave its slices back as it stopped; A gives back its own once idle (1 s).
        deadline = time.monotonic() + 10
        while _counter(stack.engine, budget_id)[1] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        factory = session_factory(stack.engine)
        with factory() as session:
            counter = session.get(BudgetCounterRow, (budget_id, "", start))
            assert counter is not None
            in_period = (
                RequestRow.tenant_id == stack.tenant_ids["small"],
                RequestRow.started_at >= start,
                RequestRow.started_at < end,
            )
            recorded = session.scalar(select(func.sum(RequestRow.cost_total)).where(*in_period))
            statuses = dict(
                session.execute(
                    select(RequestRow.status, func.count())
                    .where(*in_period)
                    .group_by(RequestRow.status)
                ).all()
            )
        assert counter.spent <= LIMIT
        assert counter.spent == recorded
        with factory() as session:
            holds = [(h.request_id, h.amount) for h in session.scalars(select(BudgetHoldRow))]
        assert counter.reserved == Decimal(0), holds  # every stopped gateway gave its slice back
        assert statuses == {"completed": outcomes["completed"], "refused": outcomes["402"]}
        # Each threshold's alert was made once the spend had reached it: the 100 % one when
        # what was spent left no room for a request, not at a refusal while the other
        # gateway's slice held the rest.
        with factory() as session:
            alerts = session.scalars(
                select(BudgetAlertRow).where(BudgetAlertRow.budget_id == budget_id)
            ).all()
        assert sorted(Decimal(a.threshold) for a in alerts) == [
            Decimal("0.5"),
            Decimal("0.8"),
            Decimal("1.0"),
        ]
        for alert in alerts:
            assert alert.spent >= Decimal(alert.threshold) * LIMIT - Decimal("0.0001"), alert
        # What remained could not cover one more request's largest cost on either gateway.
        assert LIMIT - counter.spent < Decimal("0.0001")


def _counter(engine: Any, budget_id: str) -> tuple[Decimal, Decimal]:
    start, _ = period_bounds(Period.DAY, ZoneInfo("UTC"), datetime.now(UTC))
    with session_factory(engine)() as session:
        row = session.get(BudgetCounterRow, (budget_id, "", start))
        return (row.spent, row.reserved) if row is not None else (Decimal(0), Decimal(0))


def test_a_killed_gateways_holds_return_after_their_ttl(tmp_path: Path) -> None:
    """A gateway killed mid-stream never settles; its hold goes back to the budget within
    the TTL (1 s here) and a sweep's interval, returned by the gateway still running."""
    with (
        new_database("postgres", tmp_path) as url,
        running_stack(
            tmp_path,
            url,
            tenants=("crash",),
            KVGATE_ADMIN_TOKEN=ADMIN,
            KVGATE_BUDGET_HOLD_TTL_S="1",
        ) as stack,
    ):
        stack.start_sims(1, extra=("--decode-tokens-per-s", "20"))
        stack.configure([vllm(SIM_MODEL, stack.sim_urls)])
        a = stack.start_gateway()
        env_b = gateway_env(
            url, tmp_path / "journal-b", KVGATE_ADMIN_TOKEN=ADMIN, KVGATE_BUDGET_HOLD_TTL_S="1"
        )
        assert stack.config is not None
        b = start_gateway(tmp_path, stack.config, env_b)
        try:
            reply = httpx.post(
                a.url + "/v1/admin/budgets",
                json={"scope": "tenant:crash", "limit": "1", "period": "day"},
                headers={"authorization": f"Bearer {ADMIN}"},
            )
            budget_id = reply.json()["id"]
            api = openai.OpenAI(base_url=a.url + "/v1", api_key=stack.key, max_retries=0)
            chunks = api.chat.completions.create(
                model=SIM_MODEL,
                messages=[{"role": "user", "content": "long"}],
                max_tokens=400,
                stream=True,
            )
            next(iter(chunks))
            assert _counter(stack.engine, budget_id)[1] > 0  # held while it streams
            os.killpg(a.process.pid, signal.SIGKILL)
            a.process.wait()
            killed = time.monotonic()
            while _counter(stack.engine, budget_id)[1] != 0 and time.monotonic() - killed < 10:
                time.sleep(0.05)
            returned_s = time.monotonic() - killed
            assert _counter(stack.engine, budget_id) == (Decimal(0), Decimal(0))
            assert returned_s < 1 + 1 / 3 + 1.5, returned_s  # TTL, a sweep interval, slack
            assert "returned 1 budget hold(s)" in b.output()
        finally:
            b.stop()


def test_a_budget_set_or_deleted_applies_at_once_on_both_gateways(tmp_path: Path) -> None:
    """The CLI returns once every gateway has the change: the next request on either
    gateway is refused, then served again; a limit lowered to zero while both gateways
    hold slices of it refuses at once too."""
    with (
        new_database("postgres", tmp_path) as url,
        running_stack(tmp_path, url, tenants=("flip",)) as stack,
    ):
        stack.start_sims(1)
        stack.configure([vllm(SIM_MODEL, stack.sim_urls)])
        a = stack.start_gateway()
        assert stack.config is not None
        b = start_gateway(tmp_path, stack.config, gateway_env(url, tmp_path / "journal-b"))
        try:
            clients = [
                openai.OpenAI(base_url=g.url + "/v1", api_key=stack.key, max_retries=0)
                for g in (a, b)
            ]

            def statuses() -> list[int]:
                found = []
                for api in clients:
                    try:
                        api.chat.completions.create(
                            model=SIM_MODEL,
                            messages=[{"role": "user", "content": "hi"}],
                            max_tokens=4,
                        )
                        found.append(200)
                    except openai.APIStatusError as exc:
                        found.append(exc.status_code)
                return found

            # Traffic all along, so that both gateways hold slices of the budget throughout.
            stop = threading.Event()

            def busy() -> None:
                while not stop.is_set():
                    statuses()

            threading.Thread(target=busy, daemon=True).start()
            assert statuses() == [200, 200]
            out = kvgate(
                "budgets",
                "set",
                "--scope",
                "tenant:flip",
                "--limit",
                "0",
                "--period",
                "day",
                env=stack.env,
            ).stdout
            assert statuses() == [402, 402]
            kvgate(
                "budgets",
                "set",
                "--scope",
                "tenant:flip",
                "--limit",
                "1",
                "--period",
                "day",
                env=stack.env,
            )
            assert statuses() == [200, 200]
            kvgate(
                "budgets",
                "set",
                "--scope",
                "tenant:flip",
                "--limit",
                "0",
                "--period",
                "day",
                env=stack.env,
            )
            assert statuses() == [402, 402]  # lowered to zero: the slices held are no use
            kvgate("budgets", "delete", out.split()[1].rstrip(":"), env=stack.env)
            assert statuses() == [200, 200]
        finally:
            stop.set()
            b.stop()
