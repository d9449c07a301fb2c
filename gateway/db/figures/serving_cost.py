"""The cost to serve a self-hosted model: each hour's GPU cost split over its requests.

A vLLM deployment's price-book entry is what tenants are charged; what it costs to run is
its GPU time, set per replica-hour with ``kvgate gpu-cost set`` (``gateway.db.gpu_costs``).
For a deployment D and a UTC hour H of the period, with E the entry of D in force at H
(the latest whose ``effective_from`` is at or before H) and R its decode weight:

    hour cost       C   = E.per_replica_hour × E.replicas
    work of tenant  w_t = uncached_t + R × output_t      (tokens of t's attempts on D
                                                           started in H, every status)
    hour's work     W   = Σ_t w_t
    cost to serve   C × w_t / W                           (nano-dollars; see below)
    cache saving    C × cache_read_t / W                  (half-even to the nano-dollar)
    charged         Σ cost_total of t's attempts in H     (what the price book billed)
    margin          charged - cost to serve

An hour with W = 0 is idle: its whole C is an idle line of the deployment. The cost to
serve is rounded to the nano-dollar by largest remainder (ties to the first tenant id),
so the tenants' shares add up to C exactly. The cache saving is what the hour's cache
reads would have cost had they been prefilled, at the hour's cost per unit of work: it
assumes GPU time scales with work, and may exceed C when most prompt tokens were cached.

A failed or cancelled attempt took GPU time, so its tokens are work like a completed
one's; an attempt refused at admission has no tokens. Hours of the period before D's
first entry have no cost to set against them and are left out (their requests too).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.db.gpu_costs import GpuCost, gpu_costs
from gateway.db.models import DeploymentHourRow
from pricing.cost import NANO, ZERO

HOUR = timedelta(hours=1)
NANOS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class ServingLine:
    """One tenant's use of one deployment over the period: its cost to serve against what
    it was charged."""

    deployment: str
    tenant_id: str
    hours: int  # hours in which it had work
    requests: int
    uncached_tokens: int
    cache_read_tokens: int
    output_tokens: int
    cost_to_serve: Decimal
    charged: Decimal
    cache_saving: Decimal

    @property
    def margin(self) -> Decimal:
        """Charged - cost to serve."""
        return self.charged - self.cost_to_serve


@dataclass(frozen=True, slots=True)
class Idle:
    """A deployment's hours without work, and what they cost."""

    deployment: str
    hours: int
    cost: Decimal


@dataclass(frozen=True, slots=True)
class ServingCost:
    """Per deployment × tenant, and each deployment's idle hours (those with any)."""

    lines: list[ServingLine]
    idle: list[Idle]


@dataclass(slots=True)
class _Use:
    requests: int = 0
    uncached_tokens: int = 0
    cache_read_tokens: int = 0
    output_tokens: int = 0
    charged: Decimal = ZERO


def _half_even(numerator: int, denominator: int) -> int:
    quotient, remainder = divmod(numerator, denominator)
    if 2 * remainder > denominator or (2 * remainder == denominator and quotient % 2):
        quotient += 1
    return quotient


def _shares(total_nanos: int, works: dict[str, int]) -> dict[str, int]:
    """``total_nanos`` split in proportion to ``works`` (positive sum), adding up exactly."""
    whole = sum(works.values())
    shares = {t: total_nanos * w // whole for t, w in works.items()}
    left = total_nanos - sum(shares.values())
    by_remainder = sorted(works, key=lambda t: (-(total_nanos * works[t] % whole), t))
    for tenant in by_remainder[:left]:
        shares[tenant] += 1
    return shares


def _in_force(entries: list[GpuCost], hour: datetime) -> GpuCost:
    """The entry in force at ``hour``, one at or after the first entry's."""
    found = entries[0]
    for entry in entries[1:]:
        if entry.effective_from > hour:
            break
        found = entry
    return found


def _use(
    session: Session, deployments: list[str], lower: datetime, upper: datetime
) -> dict[tuple[str, datetime], dict[str, _Use]]:
    """(deployment, hour) → tenant → its attempts' tokens and charges, from the hourly
    rollup (``deployment_hours``)."""
    table = DeploymentHourRow.__table__
    query = (
        select(
            table.c.deployment,
            table.c.tenant_id,
            table.c.hour,
            func.sum(table.c.requests),
            func.sum(table.c.uncached_tokens),
            func.sum(table.c.cache_read_tokens),
            func.sum(table.c.output_tokens),
            func.sum(table.c.cost_total),
        )
        .where(
            table.c.deployment.in_(deployments),
            table.c.hour >= lower,
            table.c.hour < upper,
        )
        .group_by(table.c.deployment, table.c.tenant_id, table.c.hour)
    )
    found: dict[tuple[str, datetime], dict[str, _Use]] = defaultdict(dict)
    for deployment, tenant, at, requests, uncached, read, output, charged in session.execute(query):
        found[(deployment, at)][tenant] = _Use(
            int(requests), int(uncached or 0), int(read or 0), int(output or 0), Decimal(charged)
        )
    return found


def serving_cost(
    session: Session, lower: datetime, upper: datetime, *, tenant_ids: tuple[str, ...] = ()
) -> ServingCost:
    """Cost to serve, charged, margin and cache saving per deployment × tenant over the
    whole UTC hours [lower, upper), and each deployment's idle hours (``tenant_ids``: only
    those tenants' lines; shares are of every tenant's work all the same)."""
    entries: dict[str, list[GpuCost]] = defaultdict(list)
    for cost in gpu_costs(session):
        entries[cost.deployment].append(cost)
    use = _use(session, sorted(entries), lower, upper)
    totals: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    charged: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    idle: list[Idle] = []
    for deployment, dated in sorted(entries.items()):
        idle_hours, idle_nanos = 0, 0
        hour = max(lower, dated[0].effective_from)
        while hour < upper:
            entry = _in_force(dated, hour)
            total_nanos = int(entry.hour_cost * NANOS)
            weight = int(entry.decode_weight * NANOS)
            tenants = use.get((deployment, hour), {})
            works = {
                t: u.uncached_tokens * NANOS + weight * u.output_tokens for t, u in tenants.items()
            }
            whole = sum(works.values())
            if not whole:
                idle_hours, idle_nanos = idle_hours + 1, idle_nanos + total_nanos
            shares = _shares(total_nanos, works) if whole else dict.fromkeys(works, 0)
            for tenant, u in tenants.items():
                sums = totals[(deployment, tenant)]
                sums["hours"] += int(works[tenant] > 0)
                sums["requests"] += u.requests
                sums["uncached_tokens"] += u.uncached_tokens
                sums["cache_read_tokens"] += u.cache_read_tokens
                sums["output_tokens"] += u.output_tokens
                sums["cost_to_serve"] += shares[tenant]
                if whole:
                    sums["cache_saving"] += _half_even(
                        total_nanos * u.cache_read_tokens * NANOS, whole
                    )
                charged[(deployment, tenant)] += u.charged
            hour += HOUR
        if idle_hours:
            idle.append(Idle(deployment, idle_hours, _money(idle_nanos)))
    lines = [
        ServingLine(
            deployment=deployment,
            tenant_id=tenant,
            hours=sums["hours"],
            requests=sums["requests"],
            uncached_tokens=sums["uncached_tokens"],
            cache_read_tokens=sums["cache_read_tokens"],
            output_tokens=sums["output_tokens"],
            cost_to_serve=_money(sums["cost_to_serve"]),
            charged=charged[(deployment, tenant)].quantize(NANO),
            cache_saving=_money(sums["cache_saving"]),
        )
        for (deployment, tenant), sums in sorted(totals.items())
        if not tenant_ids or tenant in tenant_ids
    ]
    return ServingCost(lines, idle)


def _money(nanos: int) -> Decimal:
    return (Decimal(nanos) / NANOS).quantize(NANO)
