"""The ``kvgate`` command line: serve, demo, sim, replay, cachetest, db, tenants, keys, prices,
billing."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from datetime import date
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from gateway.config import ConfigError, Settings

app = typer.Typer(
    help="kvgate: an OpenAI-compatible gateway that knows what every request cost.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database migrations.", no_args_is_help=True)
tenants_app = typer.Typer(help="Tenants.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys (stored hashed; shown once).", no_args_is_help=True)
prices_app = typer.Typer(help="The dated price book.", no_args_is_help=True)
billing_app = typer.Typer(help="Billing statements.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(tenants_app, name="tenants")
app.add_typer(keys_app, name="keys")
app.add_typer(prices_app, name="prices")
app.add_typer(billing_app, name="billing")

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="Deployments file (kvgate.yaml).")
]


def settings(config: Path | None = None) -> Settings:
    """Settings from the environment (KVGATE_*), with the CLI's config file on top."""
    from pydantic import ValidationError

    try:
        loaded = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"KVGATE_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            if e["loc"]
            else e["msg"].removeprefix("Value error, ")
            for e in exc.errors(include_input=False)
        )
        fail(f"invalid settings: {problems}")
    return loaded.model_copy(update={"config": config}) if config is not None else loaded


def _sessions(s: Settings):  # type: ignore[no-untyped-def]
    from gateway.db.session import make_engine, session_factory

    return session_factory(make_engine(s.database_url))


def fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
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

    s = settings(config)
    try:
        s.deployments()
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
    from gateway.routing.peers import peer_directory

    os.environ["KVGATE_WORKERS"] = str(count)
    if s.config is not None:
        os.environ["KVGATE_CONFIG"] = str(s.config.resolve())
    metrics_dir = peer_directory(s.journal_dir) / "metrics"
    shutil.rmtree(metrics_dir, ignore_errors=True)  # the last run's values are not ours
    metrics_dir.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
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
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8101,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
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
) -> None:
    """Run a simulated vLLM replica (same HTTP API, real prefix cache, timing model)."""
    from gateway.tools.sim.events import KvEventsConfig
    from gateway.tools.sim.server import SimConfig
    from gateway.tools.sim.server import serve as serve_sim
    from gateway.tools.sim.timing import TimingModel

    timing = TimingModel(
        prefill_tokens_per_s=prefill_tokens_per_s,
        decode_tokens_per_s=decode_tokens_per_s,
        max_num_seqs=max_num_seqs,
    )
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
        ),
        host=host,
        port=port,
    )


@app.command()
def dashboard(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8501,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
) -> None:
    """Run the Streamlit dashboard on the database named by KVGATE_DATABASE_URL."""
    import os

    from dashboard.launcher import command

    argv = command(host=host, port=port)
    # Become streamlit, so signals sent to `kvgate dashboard` reach the server itself.
    os.execv(argv[0], argv)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Apply migrations to the database named by KVGATE_DATABASE_URL."""
    from gateway.db.migrate import upgrade

    s = settings()
    upgrade(s.database_url, revision)
    typer.echo(f"database at {revision}: {_safe_url(s.database_url)}")


@db_app.command("downgrade")
def db_downgrade(revision: Annotated[str, typer.Argument(help="Target revision.")]) -> None:
    """Revert migrations down to REVISION ('base' for an empty database)."""
    from gateway.db.migrate import downgrade

    s = settings()
    downgrade(s.database_url, revision)
    typer.echo(f"database at {revision}: {_safe_url(s.database_url)}")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@tenants_app.command("create")
def tenants_create(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    cache_group: Annotated[
        str | None, typer.Option(help="Share the KV cache with this group.")
    ] = None,
) -> None:
    """Create a tenant."""
    from gateway.db import crud
    from gateway.db.session import transaction

    with transaction(_sessions(settings())) as session:
        tenant = crud.create_tenant(session, name=name, cache_group=cache_group)
    typer.echo(f"tenant {tenant.name} created: {tenant.id}")


@tenants_app.command("set-group")
def tenants_set_group(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    cache_group: Annotated[str | None, typer.Option(help="Group name; omit to isolate.")] = None,
) -> None:
    """Put a tenant into an explicit KV-cache sharing group, or back into its own scope."""
    from gateway.db import crud
    from gateway.db.session import transaction

    with transaction(_sessions(settings())) as session:
        crud.set_cache_group(session, name=name, cache_group=cache_group)
    typer.echo(f"tenant {name}: cache group {cache_group or '(own scope)'}")


@keys_app.command("create")
def keys_create(tenant: Annotated[str, typer.Option(help="Tenant name.")]) -> None:
    """Issue an API key; the key is printed once, alone on the last line."""
    from gateway.db import crud
    from gateway.db.session import transaction

    with transaction(_sessions(settings())) as session:
        issued = crud.create_key(session, tenant_name=tenant)
    typer.echo(f"key {issued.id} for tenant {tenant} (store it now; it is not kept):")
    typer.echo(issued.key)


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="Key id (key_...).")]) -> None:
    """Revoke a key; gateways stop accepting it within KVGATE_KEY_REFRESH_S."""
    from gateway.db import crud
    from gateway.db.session import transaction

    with transaction(_sessions(settings())) as session:
        crud.revoke_key(session, key_id=key_id)
    typer.echo(f"key {key_id} revoked")


@prices_app.command("sync")
def prices_sync() -> None:
    """Load pricing/catalog/*.yaml into the database (idempotent; never edits an entry)."""
    from gateway.db import crud
    from gateway.db.session import transaction
    from pricing.book import load_catalog

    with transaction(_sessions(settings())) as session:
        result = crud.add_prices(session, prices=load_catalog())
    typer.echo(f"prices: {len(result.added)} added, {len(result.unchanged)} already present")


@prices_app.command("add")
def prices_add(
    model: Annotated[str, typer.Option(help="Price-book model name.")],
    effective_from: Annotated[str, typer.Option(help="ISO date or date-time (UTC if no zone).")],
    input: Annotated[str, typer.Option(help="Uncached input, per 1M tokens.")],
    cache_read: Annotated[str, typer.Option(help="Cache read, per 1M tokens.")],
    output: Annotated[str, typer.Option(help="Output, per 1M tokens.")],
    cache_write: Annotated[str | None, typer.Option(help="Cache write, per 1M tokens.")] = None,
    currency: Annotated[str, typer.Option(help="Currency code.")] = "USD",
    source: Annotated[str, typer.Option(help="Where this price comes from.")] = "kvgate prices add",
) -> None:
    """Add a dated price entry (USD per million tokens)."""
    from gateway.db import crud
    from gateway.db.session import transaction
    from pricing.book import PriceError, price_from_mapping

    entry = {
        "model": model,
        "effective_from": effective_from,
        "input": input,
        "cache_read": cache_read,
        "cache_write": cache_write,
        "output": output,
        "currency": currency,
        "source": source,
        "captured_on": date.today(),
    }
    try:
        price = price_from_mapping(entry)
    except PriceError as exc:
        fail(str(exc))
    with transaction(_sessions(settings())) as session:
        result = crud.add_prices(session, prices=[price])
    typer.echo(f"{price.id}: {'added' if result.added else 'already present'}")


@prices_app.command("import-litellm")
def prices_import_litellm(
    captured_on: Annotated[str, typer.Option(help="Day the map's prices held, YYYY-MM-DD.")],
    match: Annotated[str, typer.Option(help="Only models whose name matches this glob.")] = "*",
    dry_run: Annotated[bool, typer.Option(help="Show what would be added; add nothing.")] = False,
) -> None:
    """Add dated entries from the price map inside the installed litellm (never edits one)."""
    from gateway.db import crud
    from gateway.db.session import transaction
    from gateway.upstream.providers import bundled_price_map
    from pricing.litellm_map import plan_import, prices_from_map

    version, price_map = bundled_price_map()
    prices = prices_from_map(
        price_map,
        captured_on=date.fromisoformat(captured_on),
        source=f"litellm {version}",
        match=match,
    )
    with transaction(_sessions(settings())) as session:
        plan = plan_import(crud.price_book(session), prices)
        if not dry_run:
            crud.add_prices(session, prices=plan.add)
    for conflict in plan.conflicts:
        typer.secho(f"left as it is (other rates on that day): {conflict}", err=True)
    verb = "would add" if dry_run else "added"
    typer.echo(
        f"litellm {version}: {verb} {len(plan.add)}, unchanged {len(plan.unchanged)}, "
        f"conflicts {len(plan.conflicts)}"
    )


@prices_app.command("list")
def prices_list(model: Annotated[str | None, typer.Option(help="Only this model.")] = None) -> None:
    """The price book, oldest entry first per model."""
    from gateway.db import crud

    with _sessions(settings())() as session:
        book = crud.price_book(session)
    typer.echo("model\teffective_from\tinput\tcache_read\tcache_write\toutput\tcurrency\tsource")
    for p in book.entries(model):
        typer.echo(
            f"{p.model}\t{p.effective_from:%Y-%m-%dT%H:%M:%SZ}\t{p.input}\t{p.cache_read}"
            f"\t{'' if p.cache_write is None else p.cache_write}\t{p.output}"
            f"\t{p.currency}\t{p.source}"
        )


@billing_app.command("statement")
def billing_statement(
    tenant: Annotated[str, typer.Option(help="Tenant name.")],
    start: Annotated[str, typer.Option(help="First UTC day, YYYY-MM-DD.")],
    end: Annotated[str, typer.Option(help="Last UTC day, YYYY-MM-DD.")],
    format: Annotated[str, typer.Option(help="json or csv.")] = "json",
) -> None:
    """Print a tenant's statement, the same bytes as the billing API."""
    from gateway import billing
    from gateway.db import crud

    if format not in ("json", "csv"):
        fail("--format must be json or csv")
    with _sessions(settings())() as session:
        statement = billing.build_statement(
            session,
            tenant=crud.get_tenant(session, name=tenant),
            start=date.fromisoformat(start),
            end=date.fromisoformat(end),
        )
    sys.stdout.buffer.write(billing.render(statement, format)[0])


@app.command()
def ceiling(
    start: Annotated[str, typer.Option(help="First UTC day, YYYY-MM-DD.")],
    end: Annotated[str, typer.Option(help="Last UTC day, YYYY-MM-DD.")],
    model: Annotated[str | None, typer.Option(help="Only this model.")] = None,
) -> None:
    """Achieved token hit rate against the ceiling, per tenant and model, from the records."""
    from gateway.db.figures.spend import Scope, achieved_vs_ceiling
    from gateway.db.lookups import tenant_names
    from gateway.db.statements import day_bounds

    lower, upper = day_bounds(date.fromisoformat(start), date.fromisoformat(end))
    with _sessions(settings())() as session:
        rows = achieved_vs_ceiling(session, Scope(lower, upper, models=(model,) if model else ()))
        names = tenant_names(session)
    typer.echo("tenant\tmodel\tprompt_tokens\thit_rate\tceiling\tefficiency")
    for row in rows:
        f = row.figures
        typer.echo(
            f"{names.get(row.tenant_id, row.tenant_id)}\t{row.model}\t{f.prompt_tokens}"
            f"\t{_percent(f.hit_rate)}\t{_percent(f.ceiling_rate)}"
            f"\t{_percent(f.routing_efficiency)}"
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
    from gateway.errors import KvgateError

    try:
        app()
    except (KvgateError, ConfigError) as exc:
        typer.secho(f"error: {getattr(exc, 'message', exc)}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
