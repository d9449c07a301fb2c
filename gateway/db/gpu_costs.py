"""The dated GPU costs of vLLM deployments: what one replica-hour costs, how many replicas
each hour is charged for, and the decode weight that splits an hour over its requests.

Like prices, entries are dated and never edited: a cost that changes gets a new entry
from a later hour. Gateways do not hold these in memory (only reports read them), so a
change needs no publishing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db.models import GpuCostRow
from gateway.errors import InvalidRequest

# An output token's GPU time in uncached prompt tokens prefilled, when none is measured:
# the simulator's timing model (10,000 prefill tokens/s; 40 decode tokens/s per sequence,
# 64 sequences side by side: 2,560/s) gives 10,000 / 2,560 ≈ 3.9, and hosted price books
# charge output at 4 to 5 times input (a market view of the same ratio).
DEFAULT_DECODE_WEIGHT = Decimal(4)
NINE_PLACES = Decimal("0.000000001")
MAX_AMOUNT = Decimal(10**9)  # Numeric(18, 9) holds less than 10^9 whole units
MAX_REPLICAS = 1_000_000  # an Integer column; more replicas than any fleet has


@dataclass(frozen=True, slots=True)
class GpuCost:
    """One deployment's cost per hour from ``effective_from`` until its next entry."""

    deployment: str
    effective_from: datetime
    per_replica_hour: Decimal
    replicas: int
    # The GPU time of one output token, in uncached prompt tokens prefilled.
    decode_weight: Decimal
    created_at: datetime | None = None

    def __post_init__(self) -> None:
        at = self.effective_from
        if at.tzinfo is None or (at.minute, at.second, at.microsecond) != (0, 0, 0):
            raise InvalidRequest(f"a GPU cost takes effect at a whole UTC hour, not {at}")
        if not 0 <= self.per_replica_hour < MAX_AMOUNT or _places(self.per_replica_hour) > 9:
            raise InvalidRequest(
                f"the cost per replica-hour is 0 or more, under {MAX_AMOUNT}, to at most 9 places"
            )
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise InvalidRequest(
                f"a GPU cost is charged for 1 to {MAX_REPLICAS} replicas, not {self.replicas}"
            )
        if self.hour_cost >= MAX_AMOUNT:
            raise InvalidRequest(f"an hour of the deployment costs under {MAX_AMOUNT}")
        if self.decode_weight <= 0 or _places(self.decode_weight) > 9:
            raise InvalidRequest("the decode weight is more than 0, to at most 9 places")

    @property
    def hour_cost(self) -> Decimal:
        """What one hour of the deployment costs: per replica-hour × replicas."""
        return (self.per_replica_hour * self.replicas).quantize(NINE_PLACES)


def _places(value: Decimal) -> int:
    exponent = value.normalize().as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


# What an entry and its row hold under the same names (the row's name for the decode
# weight is ``prefill_decode_ratio``).
STORED_AS_IS = ("deployment", "effective_from", "per_replica_hour", "replicas")


def _value(row: GpuCostRow) -> GpuCost:
    return GpuCost(
        **{name: getattr(row, name) for name in STORED_AS_IS},
        decode_weight=row.prefill_decode_ratio,
        created_at=row.created_at,
    )


def add_gpu_cost(session: Session, *, cost: GpuCost) -> bool:
    """Insert a dated entry; False when the same one is there already. An entry of the same
    deployment and hour with other figures is refused (entries are never edited)."""
    row = session.get(GpuCostRow, (cost.deployment, cost.effective_from))
    if row is not None:
        if (row.per_replica_hour, row.replicas, row.prefill_decode_ratio) != (
            cost.per_replica_hour,
            cost.replicas,
            cost.decode_weight,
        ):
            raise InvalidRequest(
                f"{cost.deployment} already has a GPU cost from "
                f"{cost.effective_from:%Y-%m-%dT%H:%MZ} with other figures; add a new entry "
                "from a later hour instead"
            )
        return False
    session.add(
        GpuCostRow(
            **{name: getattr(cost, name) for name in STORED_AS_IS},
            prefill_decode_ratio=cost.decode_weight,
            created_at=datetime.now(UTC),
        )
    )
    session.flush()
    return True


def gpu_costs(session: Session, *, deployment: str | None = None) -> list[GpuCost]:
    """Every entry (``deployment``: its alone), by deployment and date."""
    query = select(GpuCostRow).order_by(GpuCostRow.deployment, GpuCostRow.effective_from)
    if deployment is not None:
        query = query.where(GpuCostRow.deployment == deployment)
    return [_value(row) for row in session.scalars(query)]
