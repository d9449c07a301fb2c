"""A world for the cost to serve: deployment ``m`` with two dated GPU costs, two tenants'
attempts over three hours (one of them idle), and attempts the report leaves out.

The hand computation is in ``EXPECTED`` (USD, to the nano-dollar); the records are priced
by the July entry of ``tests.factories.BOOK`` (0.15 / 0.015 / 0.45 per 1M tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import Engine

from gateway.accounting.recorder import insert_records
from gateway.accounting.records import Status
from gateway.db.gpu_costs import GpuCost, add_gpu_cost
from gateway.db.session import session_factory, transaction
from gateway.usage import Usage
from tests.factories import JAN, JUL, record, tenants

D = Decimal


def at(hour: int, minute: int = 0) -> datetime:
    """A moment on 1 July 2026, UTC."""
    return datetime(2026, 7, 1, hour, minute, tzinfo=UTC)


# 10:00 on: 2.50 per replica-hour × 2 replicas = 5.00 an hour, an output token = 4 prompt
# tokens; 12:00 on: 3.00 × 1 = 3.00 an hour, decode weight 2.
FIRST = GpuCost("m", at(10), D("2.50"), 2, D(4))
SECOND = GpuCost("m", at(12), D("3.00"), 1, D(2))
LOWER, UPPER = at(10), at(13)


@dataclass(frozen=True, slots=True)
class Expected:
    """One tenant's line over [10:00, 13:00)."""

    tenant: str
    hours: int
    requests: int
    cost_to_serve: Decimal
    charged: Decimal
    cache_saving: Decimal
    margin: Decimal


EXPECTED = [
    # 10:00, C = 5, R = 4: a's work 1000 + 4 × 100 = 1400, b's 500 + 4 × 25 = 600, W = 2000:
    #   a 5 × 1400 / 2000 = 3.5, b 1.5; a's saving 5 × 3000 / 2000 = 7.5.
    # 11:00 idle: 5.00. 12:00, C = 3, R = 2: a's work 100, b's 100 + 2 × 1 = 102, W = 202:
    #   a 3 × 100 / 202 = 1.48514851485…, b 1.51485148514…; in nano-dollars the floors
    #   leave one over, which goes to a (remainder .85 against .15): 1.485148515 and
    #   1.514851485, 3 exactly. a's saving 3 × 50 / 202 = 0.742574257(4…).
    # Charged: a 1000 × 0.15 + 3000 × 0.015 + 100 × 0.45 = 0.00024 (per 1M) and
    #   100 × 0.15 + 50 × 0.015 = 0.00001575; b 500 × 0.15 + 25 × 0.45 = 0.00008625 and
    #   (its failed attempt) 100 × 0.15 + 1 × 0.45 = 0.00001545.
    Expected("a", 2, 2, D("4.985148515"), D("0.000255750"), D("8.242574257"), D("-4.984892765")),
    Expected("b", 2, 2, D("3.014851485"), D("0.000101700"), D("0.000000000"), D("-3.014749785")),
]
IDLE_HOURS, IDLE_COST = 1, D("5.000000000")


def serving_world(engine: Engine, *, costs: bool = True) -> dict[str, str]:
    """Tenants a and b, the GPU costs (unless not ``costs``) and the records above; the
    tenants' ids by name."""
    made = tenants(engine, "a", "b", prices=[JAN, JUL])
    a, b = made["a"].id, made["b"].id
    with transaction(session_factory(engine)) as session:
        for cost in (FIRST, SECOND) if costs else ():
            add_gpu_cost(session, cost=cost)
    insert_records(
        engine,
        [
            record("r1", tenant_id=a, started_at=at(10, 5), usage=Usage(1000, 3000, 0, 100)),
            record("r2", tenant_id=b, started_at=at(10, 59), usage=Usage(500, 0, 0, 25)),
            record("r3", tenant_id=a, started_at=at(12, 1), usage=Usage(100, 50, 0, 0)),
            record(
                "r4",
                tenant_id=b,
                started_at=at(12, 30),
                usage=Usage(100, 0, 0, 1),
                status=Status.FAILED,
            ),
            # Left out: before the first entry, after the period, another deployment.
            record("r5", tenant_id=a, started_at=at(9, 30), usage=Usage(9, 0, 0, 9)),
            record("r6", tenant_id=a, started_at=at(13), usage=Usage(9, 0, 0, 9)),
            record("r7", tenant_id=b, started_at=at(10), deployment="x", model="x", prices=None),
        ],
    )
    return {"a": a, "b": b}
