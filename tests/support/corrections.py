"""A world with one price entry to correct: its requests of two tenants on two UTC days,
at its standard, long-context and tier rates, beside requests of another entry.

The hand computation of what the entry billed and what ``CORRECTED`` makes of it is in
``EXPECTED``; every figure is in USD, to the nano-dollar.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

from sqlalchemy import Engine

from gateway.accounting.recorder import insert_records
from gateway.usage import Usage
from tests.factories import price, record, tenants

D = Decimal
ENTRY = price(
    "m",
    "2026-01-01",
    input="0.20",
    cache_read="0.02",
    output="0.60",
    cache_write="0.25",
    cache_write_1h="0.40",
    long_context={"above": 2000, "input": "0.40", "cache_read": "0.04", "output": "1.20"},
    tiers={"priority": {"input": "0.50", "cache_read": "0.05", "output": "1.50"}},
)
OTHER = price("other", "2026-01-01", input="1", cache_read="0.1", output="2")
# The correction: input and cache read were wrong; writes, output, long-context and tier
# rates stay as the entry has them.
CORRECTED = {"input": D("0.3333"), "cache_read": D("0.0333")}
JUL1 = datetime(2026, 7, 1, 10, tzinfo=UTC)
JUL2 = datetime(2026, 7, 2, 9, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Expected:
    """One tenant × day × model, as the correction's table shows it."""

    tenant: str
    day: date
    requests: int
    billed: Decimal
    corrected: Decimal
    delta: Decimal


EXPECTED = [
    # r1 standard: billed 1000 × 0.20 + 500 × 0.02 + (200 × 0.25 + 100 × 0.40) + 200 × 0.60
    #   = 0.0002 + 0.00001 + 0.00009 + 0.00012 = 0.00042; corrected 1000 × 0.3333 = 0.0003333,
    #   500 × 0.0333 = 0.00001665, writes and output the same: 0.00055995.
    # r2 long context (2500 > 2000): 2500 × 0.40 + 10 × 1.20 = 0.001012 both times.
    Expected("a", date(2026, 7, 1), 2, D("0.001432000"), D("0.001571950"), D("0.000139950")),
    # r3 priority tier: 7 × 0.50 + 3 × 0.05 + 1 × 1.50 = 0.00000515 both times.
    # r4 standard: billed 7 × 0.20 + 3 × 0.02 + 1 × 0.60 = 0.00000206; corrected 7 × 0.3333
    #   = 0.0000023331 → 0.000002333, 3 × 0.0333 = 0.0000000999 → 0.000000100 (each class
    #   rounded half-even to the nano-dollar, per request), + 0.0000006 = 0.000003033.
    Expected("a", date(2026, 7, 2), 2, D("0.000007210"), D("0.000008183"), D("0.000000973")),
    # r5: 1000 × 0.20 = 0.0002; corrected 1000 × 0.3333 = 0.0003333.
    Expected("b", date(2026, 7, 1), 1, D("0.000200000"), D("0.000333300"), D("0.000133300")),
]


def corrections_world(engine: Engine) -> dict[str, str]:
    """Tenants a and b with the records above; their ids by name."""
    made = tenants(engine, "a", "b", prices=[ENTRY, OTHER])
    a, b = made["a"].id, made["b"].id
    insert_records(
        engine,
        [
            record(
                "r1",
                tenant_id=a,
                started_at=JUL1,
                prices=ENTRY,
                usage=Usage(1000, 500, 300, 200, cache_write_1h_tokens=100),
            ),
            record("r2", tenant_id=a, started_at=JUL1, prices=ENTRY, usage=Usage(2500, 0, 0, 10)),
            record(
                "r3",
                tenant_id=a,
                started_at=JUL2,
                prices=ENTRY,
                usage=Usage(7, 3, 0, 1),
                service_tier="priority",
            ),
            record("r4", tenant_id=a, started_at=JUL2, prices=ENTRY, usage=Usage(7, 3, 0, 1)),
            record("r5", tenant_id=b, started_at=JUL1, prices=ENTRY, usage=Usage(1000, 0, 0, 0)),
            # Another entry's request: no correction of ENTRY touches it.
            record("r6", tenant_id=a, started_at=JUL1, model="other", prices=OTHER),
        ],
    )
    return {"a": a, "b": b}
