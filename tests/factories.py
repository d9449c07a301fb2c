"""Factories for what tests build again and again: prices, records, tenants and keys,
deployments (the validated values and their ``kvgate.yaml`` form).

Every value goes through the project's own validation (``price_from_mapping``, the
deployments file's model, ``crud``), and a record is priced as the gateway prices one: the
entry in force at its start, ``compute`` per token class. A test that wants other values
passes them; the defaults are plain, and tests that check a number state it themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from gateway.accounting.records import Record, Status
from gateway.config import Deployment, DeploymentsFile, ProviderDeployment
from gateway.db import crud
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from gateway.usage import Usage
from pricing.book import Price, PriceBook, price_from_mapping
from pricing.cost import Cost, compute

# -- prices ------------------------------------------------------------------------------


def price(
    model: str = "m",
    effective_from: str = "2026-01-01",
    *,
    input: str = "0.20",
    cache_read: str = "0.02",
    output: str = "0.60",
    **fields: Any,
) -> Price:
    """A price entry, validated as a catalog entry is (rates in USD per million tokens)."""
    return price_from_mapping(
        {
            "model": model,
            "effective_from": effective_from,
            "input": input,
            "cache_read": cache_read,
            "output": output,
            **fields,
        }
    )


# Model ``m`` over a price change on 1 July 2026: the billing and dashboard worlds use both.
JAN = price("m", "2026-01-01", input="0.20", cache_read="0.02", output="0.60")
JUL = price("m", "2026-07-01", input="0.15", cache_read="0.015", output="0.45")
BOOK = PriceBook([JAN, JUL])


# The catalog's kvgate/demo-llama-8b entry in force since 2026-07-01 (pricing/catalog).
DEMO_RATES = {"input": Decimal("0.15"), "cache_read": Decimal("0.015"), "output": Decimal("0.45")}


def demo_cost(prompt: int, cached: int, output: int) -> Decimal:
    """What the demo model costs, independent of pricing/cost.py: each class at its rate,
    rounded to the nano-dollar."""
    nano = Decimal("0.000000001")
    parts = [
        (prompt - cached) * DEMO_RATES["input"],
        cached * DEMO_RATES["cache_read"],
        output * DEMO_RATES["output"],
    ]
    return sum(((Decimal(p) / Decimal(1_000_000)).quantize(nano) for p in parts), Decimal(0))


# -- records -----------------------------------------------------------------------------

STARTED = datetime(2026, 7, 1, 10, tzinfo=UTC)


def record(
    request_id: str = "req_1",
    *,
    tenant_id: str = "ten_a",
    usage: Usage | None = None,
    started_at: datetime = STARTED,
    took: timedelta = timedelta(seconds=1),
    model: str = "m",
    prices: Price | PriceBook | None = BOOK,
    bills_as: str | None = None,
    service_tier: str | None = None,
    ttft_ms: float | None = None,
    **fields: Any,
) -> Record:
    """One attempt, priced as the ledger prices it.

    ``prices`` is the book (the entry in force for ``bills_as`` at ``started_at`` is used),
    one entry (used whatever its date), or None (unpriced). ``fields`` are any other
    Record fields; ``interaction_id`` defaults to the request id, as the gateway's does.
    """
    usage = usage if usage is not None else Usage(176, 1024, 0, 30)
    if isinstance(prices, PriceBook):
        entry = prices.price_for(bills_as or model, at=started_at)
    else:
        entry = prices
    values: dict[str, Any] = {
        "request_id": request_id,
        "tenant_id": tenant_id,
        "api_key_id": "key_a",
        "interaction_id": request_id,
        "model": model,
        "deployment": model,
        "upstream": "http://r1",
        "started_at": started_at,
        "ended_at": started_at + took,
        "first_token_at": None if ttft_ms is None else started_at + timedelta(milliseconds=ttft_ms),
        "status": Status.COMPLETED,
        "usage": usage,
        "price_id": entry.id if entry else None,
        "rate_class": entry.rate_class(usage.prompt_tokens, service_tier) if entry else None,
        "cost": compute(usage, entry, tier=service_tier) if entry else Cost(),
        "extra": {"service_tier": service_tier} if service_tier else {},
    }
    values.update(fields)
    return Record(**values)


# -- tenants and keys --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant in the database, with one active key."""

    id: str
    name: str
    key: str
    key_id: str


def tenant(session: Session, name: str, *, cache_group: str | None = None) -> Tenant:
    """A new tenant and a key for it, through the functions the CLI calls."""
    row = crud.create_tenant(session, name=name, cache_group=cache_group)
    issued = crud.create_key(session, tenant_name=name)
    return Tenant(id=row.id, name=name, key=issued.key, key_id=issued.id)


def tenants(engine: Engine, *names: str, prices: Iterable[Price] = ()) -> dict[str, Tenant]:
    """Prices, then a tenant with one key for each name, in one transaction."""
    with transaction(session_factory(engine)) as session:
        crud.add_prices(session, prices=list(prices))
        return {name: tenant(session, name) for name in names}


def prepared_database(
    database_url: str, *names: str, prices: Iterable[Price] = ()
) -> dict[str, Tenant]:
    """Every migration, then ``prices`` and the tenants named (each with a key)."""
    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        return tenants(engine, *names, prices=prices)
    finally:
        engine.dispose()


# -- deployments -------------------------------------------------------------------------

LOOPBACK = ("http://127.0.0.1:9001", "http://127.0.0.1:9002")


def vllm(name: str = "m", replicas: Sequence[str] = LOOPBACK, **fields: Any) -> dict[str, Any]:
    """A vLLM deployment as ``kvgate.yaml`` writes it."""
    return {"name": name, "replicas": list(replicas), **fields}


def litellm(name: str, litellm_model: str, **fields: Any) -> dict[str, Any]:
    """A hosted deployment (``backend: litellm``) as ``kvgate.yaml`` writes it."""
    return {"name": name, "backend": "litellm", "litellm_model": litellm_model, **fields}


def deployments(*entries: Mapping[str, Any]) -> tuple[Deployment | ProviderDeployment, ...]:
    """The deployments of a ``kvgate.yaml`` with these entries, validated as it is loaded."""
    return DeploymentsFile.model_validate({"models": [dict(e) for e in entries]}).models


def deployment(name: str = "m", replicas: Sequence[str] = LOOPBACK, **fields: Any) -> Deployment:
    """One vLLM deployment, validated as ``kvgate.yaml`` is."""
    [made] = deployments(vllm(name, replicas, **fields))
    assert isinstance(made, Deployment)
    return made


def config_file(path: Path, entries: Iterable[Mapping[str, Any]]) -> Path:
    """Write a ``kvgate.yaml`` with these entries (checked first: a typo fails here)."""
    models = [dict(entry) for entry in entries]
    deployments(*models)
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    return path
