"""Prefix breakers live: `kvgate serve` before a `kvgate sim` replica, exact (sim tokenizer).

The acceptance workload: a chat whose system prompt starts with the current time breaks
every turn's block chain at the timestamp, and loses (to the cache) all of the previous
turn's prompt; with the timestamp moved to the end of the system prompt the break is late,
and the stable text before it is served from cache: its saving. Every figure is checked
against a hand computation from the sim's tokenizer and the price in force.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gateway.db.figures import breaks as break_figures
from gateway.db.figures.spend import Scope, by_tenant
from gateway.db.models import BreakHourRow, RequestRow
from gateway.db.session import session_factory
from gateway.routing.sim_tokenizer import encode, render_chat
from tests.conftest import _backends, new_database
from tests.factories import vllm
from tests.support.processes import kvgate
from tests.support.stack import SIM_MODEL, Stack, running_stack

pytestmark = pytest.mark.e2e
MODEL = "breaky"
BLOCK = 16
# In force on the day these tests run (pricing/catalog/demo.yaml, from 2026-07-01).
INPUT, CACHE_READ = Decimal("0.15"), Decimal("0.015")
STABLE = "You answer questions about prefix caching, briefly and in full sentences. " * 12
# Long enough that each turn's prompt has full blocks past the system prompt's end.
QUESTIONS = tuple(
    f"Question {n}: what happens to the blocks of a prompt when its text changes early? " * 3
    for n in range(3)
)


@pytest.fixture(params=_backends())
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("breakers")  # one stack per database
    with (
        new_database(request.param, tmp) as database_url,
        running_stack(tmp, database_url, tenants=("top", "bottom")) as stack,
    ):
        [sim] = stack.start_sims(1)
        stack.configure(
            [
                vllm(
                    MODEL,
                    [sim.url],
                    tokenizer="kvgate-sim",
                    upstream_model=SIM_MODEL,
                    price_model=SIM_MODEL,
                )
            ]
        )
        stack.start_gateway()
        yield stack


def now() -> str:
    return datetime.now(UTC).isoformat()  # microseconds: every turn's time differs


def converse(stack: Stack, tenant: str, system: Any) -> list[list[dict[str, str]]]:
    """Three turns of one interaction, each resending the history; the prompts sent."""
    client = stack.client(tenant)
    history: list[dict[str, str]] = []
    sent = []
    for question in QUESTIONS:
        history.append({"role": "user", "content": question})
        messages = [{"role": "system", "content": system()}, *history]
        reply = client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            extra_headers={"x-interaction-id": f"{tenant}-chat"},
        )
        assert reply.usage is not None
        assert reply.usage.prompt_tokens == tokens(messages)  # the sim counts as we do
        sent.append(messages)
        history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    return sent


def tokens(messages: list[dict[str, str]]) -> int:
    return len(encode(render_chat(messages)))


def money(tokens: int) -> Decimal:
    """tokens × (input - cache-read rate), per million, to the nano-dollar (exact here)."""
    return (tokens * (INPUT - CACHE_READ) / 1_000_000).quantize(Decimal("0.000000001"))


def test_a_timestamp_first_breaks_every_turn_early_and_at_the_end_late_with_its_saving(
    stack: Stack,
) -> None:
    kvgate("tenants", "set-capture", "--tenant", "top", "--break-context", "on", env=stack.env)
    top = converse(stack, "top", lambda: f"{now()} {STABLE}")
    bottom = converse(stack, "bottom", lambda: f"{STABLE}The time is {now()}.")
    rows = stack.rows(RequestRow.model == MODEL, count=6)
    by_tenant_rows = {
        name: [r for r in rows if r.tenant_id == stack.tenant_ids[name]]
        for name in ("top", "bottom")
    }

    # The timestamp is the system prompt's first token (after "<|system|>\n"): block 0.
    top_tokens = [tokens(m) for m in top]
    assert [(r.break_tokens, r.lost_tokens, r.break_early) for r in by_tenant_rows["top"]] == [
        (None, None, None),
        (0, top_tokens[0], True),
        (0, top_tokens[1], True),
    ]
    assert [r.cache_read_tokens for r in by_tenant_rows["top"]] == [0, 0, 0]

    # At the end: the timestamp's token follows the system prompt's stable text.
    offset = 1 + len(encode(STABLE + "The time is "))
    late = offset // BLOCK * BLOCK
    bottom_tokens = [tokens(m) for m in bottom]
    assert [(r.break_tokens, r.lost_tokens, r.break_early) for r in by_tenant_rows["bottom"]] == [
        (None, None, None),
        (late, bottom_tokens[0] - late, False),
        (late, bottom_tokens[1] - late, False),
    ]
    # What comes before the timestamp is reused: the turns after the first read it cached.
    assert [r.cache_read_tokens for r in by_tenant_rows["bottom"]] == [0, late, late]

    listed = json.loads(kvgate("breakers", "--format", "json", env=stack.env).stdout)
    top_lost = top_tokens[0] + top_tokens[1]
    bottom_lost = bottom_tokens[0] + bottom_tokens[1] - 2 * late
    context = listed[1].pop("context")
    assert listed == [
        {
            "tenant": "bottom",
            "model": MODEL,
            "break_tokens": late,
            "requests": 2,
            "lost_tokens": bottom_lost,
            "lost_usd": str(money(bottom_lost)),
            "early": False,
        },
        {
            "tenant": "top",
            "model": MODEL,
            "break_tokens": 0,
            "requests": 2,
            "lost_tokens": top_lost,
            "lost_usd": str(money(top_lost)),
            "early": True,
        },
    ]
    # The top tenant opted in: the text around the last break, as the replica renders it.
    previous = render_chat(top[1])
    current = render_chat(top[2])
    at = next(i for i, (a, b) in enumerate(zip(previous, current, strict=False)) if a != b)
    assert context == {
        "offset": at,
        "before": previous[max(0, at - 48) : at],
        "previous": previous[at : at + 48],
        "current": current[at : at + 48],
        "at": context["at"],
    }
    assert previous.startswith("<|system|>\n20") and 13 < at < 40  # inside the timestamp

    # Beside "saved by the cache": what the breaks lost, in money, per tenant.
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    scope = Scope(hour.replace(hour=0), hour + timedelta(hours=1))
    with session_factory(stack.engine)() as session:
        per_tenant = {
            name: break_figures.lost(
                session, Scope(scope.lower, scope.upper, (stack.tenant_ids[name],))
            )
            for name in ("top", "bottom")
        }
        saved = by_tenant(session, scope)
        rollup = session.scalars(select(BreakHourRow).order_by(BreakHourRow.break_tokens)).all()
    assert per_tenant["top"] == break_figures.Lost(2, top_lost, 2, money(top_lost))
    assert per_tenant["bottom"] == break_figures.Lost(2, bottom_lost, 0, money(bottom_lost))
    assert saved[stack.tenant_ids["top"]].saved == 0
    assert saved[stack.tenant_ids["bottom"]].saved == money(2 * late)  # moving it: the saving
    assert [(r.break_tokens, r.requests, r.lost_tokens) for r in rollup] == [
        (0, 2, top_lost),
        (late, 2, bottom_lost),
    ]

    # The tenant's own view, through the billing API: only its own positions, with its text.
    reply = httpx.get(
        stack.url + "/v1/billing/breakers",
        params={"since": date.today().isoformat()},
        headers={"authorization": f"Bearer {stack.keys['bottom']}"},
    )
    assert reply.status_code == 200
    assert reply.json() == [listed[0]]

    # The table names each position; opting out deletes the text that was kept.
    table = kvgate("breakers", "--tenant", "top", env=stack.env).stdout.splitlines()
    assert table[0] == "tenant\tmodel\tbreak_tokens\tearly\trequests\tlost_tokens\tlost_usd"
    assert table[1].startswith(f"top\t{MODEL}\t0\tearly\t2\t")
    assert table[2].startswith("\tat character ")
    off = kvgate(
        "tenants", "set-capture", "--tenant", "top", "--break-context", "off", env=stack.env
    )
    assert off.stdout.strip() == "tenant top: break context not kept; 2 kept context(s) deleted"
    with session_factory(stack.engine)() as session:
        kept = session.scalars(
            select(RequestRow.break_context).where(RequestRow.break_context.is_not(None))
        ).all()
    assert kept == []
