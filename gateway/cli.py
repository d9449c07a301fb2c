"""The ``kvgate`` command line: serve, demo, sim, replay, cachetest, db, tenants, keys, prices,
billing (tenants, keys and prices: cli_directory.py; breakers and tenants set-capture:
cli_breakers.py; reconcile: cli_reconcile.py; budgets and limits: cli_budgets.py; prices
correct: cli_corrections.py; gpu-cost: cli_gpu_cost.py)."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli_breakers import breakers
from gateway.cli_budgets import budgets_app, limits_app
from gateway.cli_corrections import prices_correct
from gateway.cli_directory import keys_app, prices_app, tenants_app
from gateway.cli_gpu_cost import gpu_cost_app
from gateway.cli_reconcile import reconcile_app
from gateway.cli_support import (
    ConfigOption,
    FirstDay,
    LastDay,
    ModelFilter,
    TenantOption,
    day,
    fail,
    one_of,
    sessions_for,
    settings,
)
from gateway.config import ConfigError
from gateway.tools.sim.options import block_ms_option

app = typer.Typer(
    help="kvgate: an OpenAI-compatible gateway that knows what every request cost.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database migrations.", no_args_is_help=True)
billing_app = typer.Typer(help="Billing statements.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(tenants_app, name="tenants")
app.add_typer(keys_app, name="keys")
app.add_typer(prices_app, name="prices")
app.add_typer(billing_app, name="billing")
app.add_typer(reconcile_app, name="reconcile")
app.add_typer(budgets_app, name="budgets")
app.add_typer(limits_app, name="limits")
app.add_typer(gpu_cost_app, name="gpu-cost")
app.command("breakers")(breakers)
prices_app.command("correct")(prices_correct)

HostOption = Annotated[str, typer.Option(help="Address to listen on.")]
PortOption = Annotated[int, typer.Option(help="Port to listen on.")]


@app.command()
def serve(
    config: ConfigOption = None,
    host: HostOption = "127.0.0.1",
    port: PortOption = 8000,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Worker processes, one per core (default KVGATE_WORKERS, else 1). They "
            "share the port, routing knowledge, the journal directory and the metrics.",
        ),
    ] = None,
) -> None:
    """Run the gateway."""
    from gateway.server import run
    from gateway.serving.fleets import fleet_configs

    s = settings(config)
    try:
        fleet_configs(s.deployments())  # what routing refuses, said before serving
    except ConfigError as exc:
        fail(str(exc))
    logging.basicConfig(
        level=s.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    count = workers or s.workers
    options: dict[str, Any] = dict(host=host, port=port, log_level=s.log_level, access_log=False)
    if count == 1:
        from gateway.app import create_app

        run(create_app(s), settings=s, **options)
        return
    # Each worker is a fresh process that reads its settings from the environment.
    from gateway.config import export_for_workers
    from gateway.routing.peers import peer_directory

    metrics_dir = peer_directory(s.journal_dir) / "metrics"
    shutil.rmtree(metrics_dir, ignore_errors=True)  # the last run's values are not ours
    metrics_dir.mkdir(parents=True)
    export_for_workers(s.model_copy(update={"workers": count}), metrics_dir=metrics_dir)
    run("gateway.app:from_environment", settings=s, factory=True, workers=count, **options)


@app.command()
def demo(
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8000,
    sim_ports: Annotated[
        str, typer.Option(help="Ports of the two simulated replicas.")
    ] = "8101,8102",
    workdir: Annotated[Path, typer.Option(help="Where the demo keeps its files.")] = Path(
        "var/demo"
    ),
    dashboard_port: Annotated[int, typer.Option(help="Dashboard port.")] = 8501,
) -> None:
    """Two simulated replicas, the gateway on SQLite, the dashboard, a short workload."""
    from gateway.tools.demo import run_demo

    run_demo(
        settings(),
        port=port,
        sim_ports=[int(p) for p in sim_ports.split(",")],
        workdir=workdir,
        dashboard_port=dashboard_port,
    )


@app.command()
def sim(
    port: PortOption = 8101,
    host: HostOption = "127.0.0.1",
    model: Annotated[str, typer.Option(help="Model name served.")] = "kvgate/demo-llama-8b",
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    capacity_blocks: Annotated[int, typer.Option(help="KV cache size in blocks.")] = 2048,
    prefill_tokens_per_s: Annotated[
        float, typer.Option(help="Prefill rate (0: instant).")
    ] = 10_000.0,
    decode_tokens_per_s: Annotated[
        float, typer.Option(help="Decode rate per sequence (0: instant).")
    ] = 40.0,
    max_num_seqs: Annotated[int, typer.Option(help="Sequences running at once.")] = 64,
    max_model_len: Annotated[int, typer.Option(help="Longest prompt + output in tokens.")] = 32_768,
    kv_events_endpoint: Annotated[
        str | None,
        typer.Option(help="Publish vLLM KV events on this ZMQ endpoint (tcp://*:PORT binds)."),
    ] = None,
    kv_events_replay_endpoint: Annotated[
        str | None,
        typer.Option(help="Answer KV event replay requests on this ZMQ endpoint (bound)."),
    ] = None,
    kv_events_topic: Annotated[str, typer.Option(help="KV events topic.")] = "",
    cpu_blocks: Annotated[
        int, typer.Option(help="Host-memory tier: blocks that keep what GPU memory evicts.", min=0)
    ] = 0,
    cpu_block_ms: Annotated[float | None, block_ms_option("host memory", "--block-size")] = None,
    disk_blocks: Annotated[
        int, typer.Option(help="Disk tier below host memory, in blocks.", min=0)
    ] = 0,
    disk_block_ms: Annotated[float | None, block_ms_option("disk", "--block-size")] = None,
) -> None:
    """Run a simulated vLLM replica (same HTTP API, real prefix cache, timing model)."""
    from gateway.tools.sim.events import KvEventsConfig
    from gateway.tools.sim.server import SimConfig
    from gateway.tools.sim.server import serve as serve_sim
    from gateway.tools.sim.timing import (
        DISK_MS_PER_TOKEN,
        HOST_MS_PER_TOKEN,
        TimingModel,
        block_load_ms,
    )

    timing = TimingModel(
        prefill_tokens_per_s=prefill_tokens_per_s,
        decode_tokens_per_s=decode_tokens_per_s,
        max_num_seqs=max_num_seqs,
        cpu_block_ms=block_load_ms(cpu_block_ms, HOST_MS_PER_TOKEN, block_size),
        disk_block_ms=block_load_ms(disk_block_ms, DISK_MS_PER_TOKEN, block_size),
    )
    if disk_blocks and not cpu_blocks:
        fail("--disk-blocks needs --cpu-blocks: the disk tier keeps what host memory evicts")
    kv_events = (
        None
        if kv_events_endpoint is None
        else KvEventsConfig(kv_events_endpoint, kv_events_replay_endpoint, kv_events_topic)
    )
    serve_sim(
        SimConfig(
            model=model,
            block_size=block_size,
            capacity_blocks=capacity_blocks,
            timing=timing,
            max_model_len=max_model_len,
            kv_events=kv_events,
            cpu_blocks=cpu_blocks,
            disk_blocks=disk_blocks,
        ),
        host=host,
        port=port,
    )


@app.command()
def dashboard(
    port: PortOption = 8501,
    host: HostOption = "127.0.0.1",
) -> None:
    """Run the Streamlit dashboard on the database named by KVGATE_DATABASE_URL.

    In production it refuses to start without KVGATE_DASHBOARD_PASSWORD.
    """
    from dashboard.launcher import OPEN_WARNING, command, environment
    from gateway.config import child_environment

    s = settings()
    refusal = s.dashboard_refusal()
    if refusal is not None:
        fail(refusal)
    if s.dashboard_password is None:
        typer.secho(f"warning: {OPEN_WARNING}", fg=typer.colors.YELLOW, err=True)
    argv = command(host=host, port=port)
    # Become streamlit, so signals sent to `kvgate dashboard` reach the server itself.
    os.execve(argv[0], argv, environment(child_environment(), s.dashboard_trusted_proxies))


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Apply migrations to the database named by KVGATE_DATABASE_URL."""
    from gateway.db.migrate import upgrade

    _migrate(upgrade, revision)


@db_app.command("downgrade")
def db_downgrade(revision: Annotated[str, typer.Argument(help="Target revision.")]) -> None:
    """Revert migrations down to REVISION ('base' for an empty database)."""
    from gateway.db.migrate import downgrade

    _migrate(downgrade, revision)


def _migrate(step: Callable[[str, str], None], revision: str) -> None:
    """Migrate the settings' database to ``revision`` with ``step`` (upgrade or downgrade);
    an unknown revision fails (exit 2)."""
    from gateway.db.session import safe_url
    from gateway.errors import InvalidRequest

    s = settings()
    try:
        step(s.database_url, revision)
    except InvalidRequest as error:
        fail(error.message)
    typer.echo(f"database at {revision}: {safe_url(s.database_url)}")


@billing_app.command("statement")
def billing_statement(
    tenant: TenantOption,
    start: FirstDay,
    end: LastDay,
    format: Annotated[str, typer.Option(help="json or csv.")] = "json",
    group_by: Annotated[
        str | None, typer.Option(help="Split lines by end_user or by tag:KEY.")
    ] = None,
) -> None:
    """Print a tenant's statement, the same bytes as the billing API."""
    from gateway import billing
    from gateway.db import crud
    from gateway.errors import InvalidRequest

    one_of(format, "json", "csv", option="--format")
    with sessions_for(settings())() as session:
        try:
            statement = billing.build_statement(
                session,
                tenant=crud.get_tenant(session, name=tenant),
                start=day(start, option="--start"),
                end=day(end, option="--end"),
                group_by=group_by,
            )
        except InvalidRequest as error:
            fail(error.message)
    sys.stdout.buffer.write(billing.render(statement, format)[0])


@app.command()
def ceiling(
    start: FirstDay,
    end: LastDay,
    model: ModelFilter = None,
) -> None:
    """Achieved token hit rate against the ceiling, per tenant and model, from the records.

    ceiling_kind says how the ceilings were counted: exact (the router had the model's
    tokenizer) or approximate (character blocks, no tokenizer).
    """
    from gateway.db.figures.spend import EXACT, Scope, achieved_vs_ceiling
    from gateway.db.lookups import tenant_names
    from gateway.db.statements import day_bounds

    first, last = day(start, option="--start"), day(end, option="--end")
    if last < first:
        fail("--end must not be before --start")
    lower, upper = day_bounds(first, last)
    with sessions_for(settings())() as session:
        rows = achieved_vs_ceiling(session, Scope(lower, upper, models=(model,) if model else ()))
        names = tenant_names(session)
    typer.echo("tenant\tmodel\tprompt_tokens\thit_rate\tceiling\tefficiency\tceiling_kind")
    for row in rows:
        f = row.figures
        typer.echo(
            f"{names.get(row.tenant_id, row.tenant_id)}\t{row.model}\t{f.prompt_tokens}"
            f"\t{_percent(f.hit_rate)}\t{_percent(f.ceiling_rate)}"
            f"\t{_percent(f.routing_efficiency)}\t{f.ceiling_kind or '-'}"
        )
    approximate = sorted({r.model for r in rows if r.figures.ceiling_kind not in (None, EXACT)})
    if approximate:
        typer.echo(
            f"approximate ceiling for {', '.join(approximate)}: counted by a router without "
            "the model's tokenizer (text mode: blocks of characters), or recorded before "
            "kvgate kept the kind; set the deployment's tokenizer for exact figures",
            err=True,
        )


def _percent(value: object) -> str:
    return "-" if value is None else f"{float(value):.2%}"  # type: ignore[arg-type]


from gateway.tools.replay.cli import replay  # noqa: E402 (defines its own options)

app.command("replay", help="Replay a Mooncake trace against routing policies (offline or live).")(
    replay
)

from gateway.tools.cachetest.cli import cachetest  # noqa: E402 (defines its own options)

app.command("cachetest", help="Run the cache test plan against an endpoint; write a report.")(
    cachetest
)


def main() -> None:
    """Run the CLI; a kvgate or configuration error prints as one red line and exits 2."""
    from gateway.errors import KvgateError

    try:
        app()
    except (KvgateError, ConfigError) as exc:
        typer.secho(f"error: {getattr(exc, 'message', exc)}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
