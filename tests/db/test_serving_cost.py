"""The cost to serve: each hour's GPU cost split over the tenants' work, idle hours on
their own line, a dated change of cost mid-period, and what the cache saved, checked
against the hand computation of ``tests/support/serving.py`` on both databases."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from gateway.db.figures.serving_cost import Idle, ServingCost, serving_cost
from gateway.db.gpu_costs import GpuCost, add_gpu_cost, gpu_costs
from gateway.db.session import make_engine, session_factory, transaction
from gateway.errors import InvalidRequest
from tests.support.serving import (
    EXPECTED,
    FIRST,
    IDLE_COST,
    IDLE_HOURS,
    LOWER,
    SECOND,
    UPPER,
    at,
    serving_world,
)

D = Decimal


@pytest.fixture
def world(database_url: str) -> Iterator[tuple[Any, dict[str, str]]]:
    engine = make_engine(database_url)
    ids = serving_world(engine)
    yield session_factory(engine), ids
    engine.dispose()


def figures(sessions: Any, lower: Any = LOWER, upper: Any = UPPER, **options: Any) -> ServingCost:
    with sessions() as session:
        return serving_cost(session, lower, upper, **options)


def test_two_tenants_an_idle_hour_and_a_dated_change_match_the_hand_computation(
    world: tuple[Any, dict[str, str]],
) -> None:
    sessions, ids = world
    found = figures(sessions)
    assert [
        (
            line.deployment,
            line.tenant_id,
            line.hours,
            line.requests,
            line.cost_to_serve,
            line.charged,
            line.cache_saving,
            line.margin,
        )
        for line in found.lines
    ] == sorted(
        (
            "m",
            ids[e.tenant],
            e.hours,
            e.requests,
            e.cost_to_serve,
            e.charged,
            e.cache_saving,
            e.margin,
        )
        for e in EXPECTED
    )
    assert found.idle == [Idle("m", IDLE_HOURS, IDLE_COST)]
    # Every hour's cost is accounted for exactly: 5 + 5 (idle) + 3.
    assert sum(line.cost_to_serve for line in found.lines) + IDLE_COST == D("13.000000000")


def test_one_hour_splits_by_work_with_output_weighted_and_cache_reads_free(
    world: tuple[Any, dict[str, str]],
) -> None:
    sessions, ids = world
    found = figures(sessions, at(10), at(11))
    assert [
        (line.tenant_id, line.cost_to_serve, line.cache_saving) for line in found.lines
    ] == sorted(
        [(ids["a"], D("3.500000000"), D("7.500000000")), (ids["b"], D("1.500000000"), D("0"))]
    )
    tokens = {
        (line.uncached_tokens, line.cache_read_tokens, line.output_tokens) for line in found.lines
    }
    assert tokens == {(1000, 3000, 100), (500, 0, 25)}
    assert found.idle == []


def test_hours_before_the_first_entry_are_left_out_and_a_tenant_filter_keeps_the_shares(
    world: tuple[Any, dict[str, str]],
) -> None:
    sessions, ids = world
    found = figures(sessions, at(8), at(12), tenant_ids=(ids["b"],))
    # 8:00 and 9:00 have no entry (r5 at 9:30 is not counted); b's share of 10:00 is
    # the same as with a beside it; 11:00 is idle.
    assert [(line.tenant_id, line.requests, line.cost_to_serve) for line in found.lines] == [
        (ids["b"], 1, D("1.500000000"))
    ]
    assert found.idle == [Idle("m", 1, D("5.000000000"))]


def test_hours_after_a_change_are_charged_at_the_new_entry_and_idle_ones_listed(
    world: tuple[Any, dict[str, str]],
) -> None:
    sessions, ids = world
    found = figures(sessions, at(13), at(16))
    # 13:00 (entry from 12:00, 3.00 an hour): r6 alone, 9 + 2 × 9 = 27 of work, all of it
    # a's; 14:00 and 15:00 idle at 3.00 each.
    assert [(line.tenant_id, line.hours, line.cost_to_serve) for line in found.lines] == [
        (ids["a"], 1, D("3.000000000"))
    ]
    assert found.idle == [Idle("m", 2, D("6.000000000"))]


def test_entries_are_dated_whole_hours_and_never_edited(
    world: tuple[Any, dict[str, str]],
) -> None:
    sessions, _ = world
    with transaction(sessions) as session:
        assert add_gpu_cost(session, cost=FIRST) is False  # the same entry again: a no-op
        with pytest.raises(InvalidRequest, match="already has a GPU cost"):
            add_gpu_cost(session, cost=GpuCost("m", at(10), D("2.60"), 2, D(4)))
    with sessions() as session:
        assert [(c.effective_from, c.hour_cost) for c in gpu_costs(session)] == [
            (FIRST.effective_from, D("5.000000000")),
            (SECOND.effective_from, D("3.000000000")),
        ]
    with pytest.raises(InvalidRequest, match="whole UTC hour"):
        GpuCost("m", at(10, 30), D(1), 1, D(4))
    with pytest.raises(InvalidRequest, match="1 to 1000000 replicas, not 0"):
        GpuCost("m", at(10), D(1), 0, D(4))
    with pytest.raises(InvalidRequest, match="decode weight"):
        GpuCost("m", at(10), D(1), 1, D(0))
    with pytest.raises(InvalidRequest, match="9 places"):
        GpuCost("m", at(10), D("0.0000000001"), 1, D(4))
