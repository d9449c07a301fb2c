"""``kvgate gpu-cost``: what a vLLM deployment costs to run (dated, per replica-hour), and
the report of cost to serve against what tenants were charged
(gateway/db/figures/serving_cost.py has the formula)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from gateway.cli_breakers import floor_hour, moment
from gateway.cli_support import ConfigOption, TableOrJson, fail, one_of, sessions_for, settings
from gateway.config import ConfigError, Deployment

HOUR = timedelta(hours=1)
gpu_cost_app = typer.Typer(
    help="The cost to serve self-hosted models: GPU time per replica-hour, dated.",
    no_args_is_help=True,
)


def _decimal(text: str, *, option: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        fail(f"{option} must be a decimal number, not {text!r}")
    if not value.is_finite():
        fail(f"{option} must be a decimal number, not {text!r}")
    return value


def _hour(text: str, *, option: str) -> datetime:
    """'now' (this UTC hour), or a day or ISO moment that is a whole UTC hour."""
    if text.strip() == "now":
        return floor_hour(datetime.now(UTC))
    at = moment(text, option=option).astimezone(UTC)
    if at != floor_hour(at):
        fail(f"{option} must be a whole UTC hour (GPU time is charged by the hour), not {text!r}")
    return at


def _configured_replicas(config: Path | None, deployment: str) -> int:
    """The replicas the deployments file gives a vLLM deployment."""
    try:
        configured = {d.name: d for d in settings(config).deployments()}
    except ConfigError as exc:
        fail(str(exc))
    found = configured.get(deployment)
    if found is None:
        fail(
            f"deployment {deployment!r} is not in the deployments file (--config or "
            "KVGATE_CONFIG); name one, or give --replicas N"
        )
    if not isinstance(found, Deployment):
        fail(f"deployment {deployment!r} is hosted: its cost is the provider's bill, not GPU time")
    return len(found.replicas)


@gpu_cost_app.command("set")
def gpu_cost_set(
    deployment: Annotated[str, typer.Option(help="vLLM deployment name (kvgate.yaml).")],
    per_replica_hour: Annotated[str, typer.Option(help="What one replica costs per hour, in USD.")],
    effective_from: Annotated[
        str,
        typer.Option(
            help="A whole UTC hour (ISO date or date-time, UTC if no zone), or 'now' (this "
            "hour). It may be in the past: the report is computed when it is read."
        ),
    ],
    replicas: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Replicas each hour is charged for (default: the deployment's replicas in "
            "the deployments file).",
        ),
    ] = None,
    decode_weight: Annotated[
        str,
        typer.Option(
            help="GPU time of one output token, in uncached prompt tokens prefilled "
            "(default 4: the simulator's timing model at full batch, about 3.9, and hosted "
            "output prices of 4-5 x input)."
        ),
    ] = "4",
    config: ConfigOption = None,
) -> None:
    """Add a dated GPU cost of a vLLM deployment; it holds until the deployment's next."""
    from gateway.db.gpu_costs import GpuCost, add_gpu_cost
    from gateway.db.session import transaction
    from gateway.errors import InvalidRequest

    cost_per_hour = _decimal(per_replica_hour, option="--per-replica-hour")
    weight = _decimal(decode_weight, option="--decode-weight")
    start = _hour(effective_from, option="--effective-from")
    count = replicas if replicas is not None else _configured_replicas(config, deployment)
    try:
        cost = GpuCost(deployment, start, cost_per_hour, count, weight)
        with transaction(sessions_for(settings())) as session:
            added = add_gpu_cost(session, cost=cost)
    except InvalidRequest as error:
        fail(error.message)
    typer.echo(
        f"{deployment} from {start:%Y-%m-%dT%H:%MZ}: {cost.per_replica_hour:f} USD per "
        f"replica-hour x {count} replica(s) = {cost.hour_cost:f} an hour, decode weight "
        f"{weight.normalize():f}: {'added' if added else 'already present'}"
    )


@gpu_cost_app.command("list")
def gpu_cost_list(
    deployment: Annotated[str | None, typer.Option(help="Only this deployment.")] = None,
) -> None:
    """Every GPU cost entry, by deployment and date."""
    from gateway.db.gpu_costs import gpu_costs

    with sessions_for(settings())() as session:
        found = gpu_costs(session, deployment=deployment)
    typer.echo("deployment\teffective_from\tper_replica_hour\treplicas\thour_cost\tdecode_weight")
    for c in found:
        typer.echo(
            f"{c.deployment}\t{c.effective_from:%Y-%m-%dT%H:%MZ}\t{c.per_replica_hour:f}"
            f"\t{c.replicas}\t{c.hour_cost:f}\t{c.decode_weight.normalize():f}"
        )
    if not found:
        typer.echo("no GPU costs set: kvgate gpu-cost set --deployment D ...", err=True)


def _line(line: Any, tenant: str) -> dict[str, Any]:
    return {
        "deployment": line.deployment,
        "tenant": tenant,
        "tenant_id": line.tenant_id,
        "hours": line.hours,
        "requests": line.requests,
        "uncached_tokens": line.uncached_tokens,
        "cache_read_tokens": line.cache_read_tokens,
        "output_tokens": line.output_tokens,
        "cost_to_serve": f"{line.cost_to_serve:f}",
        "charged": f"{line.charged:f}",
        "margin": f"{line.margin:f}",
        "cache_saving": f"{line.cache_saving:f}",
    }


@gpu_cost_app.command("report")
def gpu_cost_report(
    since: Annotated[
        str | None,
        typer.Option(help="From this UTC day or moment (its hour); default: the first entry."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            help="Before this UTC day or moment (its hour); default: the end of this hour."
        ),
    ] = None,
    format: TableOrJson = "table",
) -> None:
    """Per vLLM deployment and tenant: cost to serve, charged, margin and what the cache
    saved; each deployment's idle hours on a line of their own (USD)."""
    from gateway.db.figures.serving_cost import serving_cost
    from gateway.db.gpu_costs import gpu_costs
    from gateway.db.lookups import tenant_names

    one_of(format, "table", "json", option="--format")
    upper = (
        floor_hour(moment(until, option="--until"))
        if until
        else floor_hour(datetime.now(UTC)) + HOUR
    )
    with sessions_for(settings())() as session:
        entries = gpu_costs(session)
        if since:
            lower = floor_hour(moment(since, option="--since"))
        else:
            lower = min((c.effective_from for c in entries), default=upper)
        if upper < lower:
            fail("--until is before --since")
        found = serving_cost(session, lower, upper)
        names = tenant_names(session)
    lines = sorted(
        found.lines, key=lambda line: (line.deployment, names.get(line.tenant_id, line.tenant_id))
    )
    if format == "json":
        document = {
            "since": f"{lower:%Y-%m-%dT%H:%M:%SZ}",
            "until": f"{upper:%Y-%m-%dT%H:%M:%SZ}",
            "currency": "USD",
            "lines": [_line(line, names.get(line.tenant_id, line.tenant_id)) for line in lines],
            "idle": [
                {"deployment": i.deployment, "hours": i.hours, "cost": f"{i.cost:f}"}
                for i in found.idle
            ],
        }
        sys.stdout.buffer.write(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
        return
    typer.echo("deployment\ttenant\thours\trequests\tcost_to_serve\tcharged\tmargin\tcache_saving")
    idle = {i.deployment: i for i in found.idle}
    for deployment in sorted({line.deployment for line in lines} | set(idle)):
        for line in (line for line in lines if line.deployment == deployment):
            typer.echo(
                f"{deployment}\t{names.get(line.tenant_id, line.tenant_id)}\t{line.hours}"
                f"\t{line.requests}\t{line.cost_to_serve:f}\t{line.charged:f}\t{line.margin:f}"
                f"\t{line.cache_saving:f}"
            )
        if deployment in idle:
            i = idle[deployment]
            typer.echo(
                f"{deployment}\t(idle)\t{i.hours}\t0\t{i.cost:f}\t0.000000000\t{-i.cost:f}"
                "\t0.000000000"
            )
    if not entries:
        typer.echo("no GPU costs set: kvgate gpu-cost set --deployment D ...", err=True)
