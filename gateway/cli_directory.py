"""``kvgate tenants``, ``keys`` and ``prices``: what gateways hold in memory.

Commands that change keys or prices return once every gateway sharing the database has
applied the change (db/changes.py), and warn about any that did not confirm in time.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any

import typer

from gateway.cli_support import (
    ModelFilter,
    TenantArgument,
    TenantOption,
    day,
    fail,
    publish,
    sessions_for,
    settings,
)

tenants_app = typer.Typer(help="Tenants.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys (stored hashed; shown once).", no_args_is_help=True)
prices_app = typer.Typer(help="The dated price book.", no_args_is_help=True)


@tenants_app.command("create")
def tenants_create(
    name: TenantArgument,
    cache_group: Annotated[
        str | None, typer.Option(help="Share the KV cache with this group.")
    ] = None,
) -> None:
    """Create a tenant."""
    from gateway.db import crud
    from gateway.db.session import transaction

    with transaction(sessions_for(settings())) as session:
        tenant = crud.create_tenant(session, name=name, cache_group=cache_group)
    typer.echo(f"tenant {tenant.name} created: {tenant.id}")


@tenants_app.command("set-group")
def tenants_set_group(
    name: TenantArgument,
    cache_group: Annotated[str | None, typer.Option(help="Group name; omit to isolate.")] = None,
) -> None:
    """Put a tenant into an explicit KV-cache sharing group, or back into its own scope."""
    from gateway.db import crud

    publish(lambda session: crud.set_cache_group(session, name=name, cache_group=cache_group))
    typer.echo(f"tenant {name}: cache group {cache_group or '(own scope)'}")


@keys_app.command("create")
def keys_create(tenant: TenantOption) -> None:
    """Issue an API key; the key is printed once, alone on the last line. It works on every
    gateway sharing the database once this returns."""
    from gateway.db import crud

    issued = publish(lambda session: crud.create_key(session, tenant_name=tenant))
    typer.echo(f"key {issued.id} for tenant {tenant} (store it now; it is not kept):")
    typer.echo(issued.key)


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="Key id (key_...).")]) -> None:
    """Revoke a key; every gateway sharing the database refuses it once this returns."""
    from gateway.db import crud

    publish(lambda session: crud.revoke_key(session, key_id=key_id))
    typer.echo(f"key {key_id} revoked")


@keys_app.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
) -> None:
    """Every key (never the key itself): id, tenant, created, revoked."""
    from gateway.db import crud

    with sessions_for(settings())() as session:
        keys = crud.list_keys(session, tenant_name=tenant)
    typer.echo("id\ttenant\tcreated\trevoked")
    for key in keys:
        revoked = "" if key.revoked_at is None else f"{key.revoked_at:%Y-%m-%dT%H:%M:%SZ}"
        typer.echo(f"{key.id}\t{key.tenant}\t{key.created_at:%Y-%m-%dT%H:%M:%SZ}\t{revoked}")


@prices_app.command("sync")
def prices_sync() -> None:
    """Load pricing/catalog/*.yaml into the database (idempotent; never edits an entry)."""
    from gateway.db import crud
    from pricing.book import load_catalog

    catalog = load_catalog()
    result = publish(lambda session: crud.add_prices(session, prices=catalog))
    typer.echo(f"prices: {len(result.added)} added, {len(result.unchanged)} already present")


def _tiers(specs: list[str]) -> dict[str, dict[str, str]]:
    """--tier NAME:input=R,cache_read=R,output=R[,cache_write=R,cache_write_1h=R]."""
    tiers: dict[str, dict[str, str]] = {}
    for spec in specs:
        name, colon, rates = spec.partition(":")
        fields = [part.partition("=") for part in rates.split(",")] if rates else []
        if not colon or not name.strip() or not fields or any(not eq for _, eq, _ in fields):
            fail(f"--tier {spec!r}: expected NAME:input=R,cache_read=R,output=R[,...]")
        if name.strip() in tiers:
            fail(f"--tier {name.strip()!r} given twice")
        tiers[name.strip()] = {key.strip(): value.strip() for key, _, value in fields}
    return tiers


@prices_app.command("add")
def prices_add(
    model: Annotated[str, typer.Option(help="Price-book model name.")],
    effective_from: Annotated[
        str,
        typer.Option(
            help="ISO date or date-time (UTC if no zone), or 'now'. Earlier than the current "
            "second is refused without --backdate."
        ),
    ],
    input: Annotated[str, typer.Option(help="Uncached input, per 1M tokens.")],
    cache_read: Annotated[str, typer.Option(help="Cache read, per 1M tokens.")],
    output: Annotated[str, typer.Option(help="Output, per 1M tokens.")],
    cache_write: Annotated[
        str | None, typer.Option(help="Cache write (5-minute), per 1M tokens.")
    ] = None,
    cache_write_1h: Annotated[
        str | None, typer.Option("--cache-write-1h", help="1-hour cache write, per 1M tokens.")
    ] = None,
    long_context_above: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="A prompt longer than this many tokens is priced entirely at the "
            "--long-context-* rates (input, cache-read and output required).",
        ),
    ] = None,
    long_context_input: Annotated[str | None, typer.Option(help="Long-context input.")] = None,
    long_context_cache_read: Annotated[
        str | None, typer.Option(help="Long-context cache read.")
    ] = None,
    long_context_cache_write: Annotated[
        str | None, typer.Option(help="Long-context cache write (5-minute).")
    ] = None,
    long_context_cache_write_1h: Annotated[
        str | None,
        typer.Option("--long-context-cache-write-1h", help="Long-context 1-hour cache write."),
    ] = None,
    long_context_output: Annotated[str | None, typer.Option(help="Long-context output.")] = None,
    tier: Annotated[
        list[str] | None,
        typer.Option(
            help="A service tier's rates, repeatable: NAME:input=R,cache_read=R,output=R"
            "[,cache_write=R,cache_write_1h=R] (used when a response reports that tier)."
        ),
    ] = None,
    currency: Annotated[str, typer.Option(help="Currency code.")] = "USD",
    source: Annotated[str, typer.Option(help="Where this price comes from.")] = "kvgate prices add",
    backdate: Annotated[
        bool,
        typer.Option(
            "--backdate",
            help="Allow an effective_from in the past. Requests recorded since then keep "
            "the price they were recorded with: history is never rewritten.",
        ),
    ] = False,
) -> None:
    """Add a dated price entry (per million tokens); every gateway sharing the database
    prices with it the requests that start after this returns."""
    from datetime import UTC, datetime

    from gateway.db import crud
    from pricing.book import PriceError, price_from_mapping

    # The price book counts in whole seconds (entry ids are), so "now" is this second.
    this_second = datetime.now(UTC).replace(microsecond=0)
    entry: dict[str, Any] = {
        "model": model,
        "effective_from": this_second if effective_from.strip() == "now" else effective_from,
        "input": input,
        "cache_read": cache_read,
        "cache_write": cache_write,
        "cache_write_1h": cache_write_1h,
        "output": output,
        "currency": currency,
        "source": source,
        "captured_on": date.today(),
    }
    long_context = {
        name: value
        for name, value in (
            ("input", long_context_input),
            ("cache_read", long_context_cache_read),
            ("cache_write", long_context_cache_write),
            ("cache_write_1h", long_context_cache_write_1h),
            ("output", long_context_output),
        )
        if value is not None
    }
    if long_context_above is not None:
        entry["long_context"] = {"above": long_context_above, **long_context}
    elif long_context:
        fail("--long-context-* rates need --long-context-above N")
    if tier:
        entry["tiers"] = _tiers(tier)
    try:
        price = price_from_mapping(entry)
    except PriceError as exc:
        fail(str(exc))
    past = price.effective_from < this_second
    if past and not backdate:
        fail(
            f"effective_from {price.effective_from:%Y-%m-%dT%H:%M:%SZ} is in the past; "
            "requests recorded since then would keep their price (history is never "
            "rewritten); use --effective-from now for this moment, or pass --backdate to add "
            "it all the same"
        )

    def add(session: Any) -> tuple[bool, int]:
        added = bool(crud.add_prices(session, prices=[price]).added)
        since = price.effective_from
        return added, crud.records_since(session, model=price.model, since=since) if past else 0

    added, later = publish(add)
    typer.echo(f"{price.id}: {'added' if added else 'already present'}")
    if past and added:
        typer.echo(
            f"backdated: {later} record(s) of {price.model} started at or after "
            f"{price.effective_from:%Y-%m-%dT%H:%M:%SZ}; they keep the price they were "
            "recorded with (history is never rewritten)"
        )


@prices_app.command("import-litellm")
def prices_import_litellm(
    captured_on: Annotated[str, typer.Option(help="Day the map's prices held, YYYY-MM-DD.")],
    match: Annotated[str, typer.Option(help="Only models whose name matches this glob.")] = "*",
    dry_run: Annotated[bool, typer.Option(help="Show what would be added; add nothing.")] = False,
) -> None:
    """Add dated entries from the price map inside the installed litellm (never edits one)."""
    from gateway.db import crud
    from gateway.upstream.providers import bundled_price_map
    from pricing.litellm_map import plan_import, prices_from_map

    version, price_map = bundled_price_map()
    prices = prices_from_map(
        price_map,
        captured_on=day(captured_on, option="--captured-on"),
        source=f"litellm {version}",
        match=match,
    )
    with sessions_for(settings())() as session:
        plan = plan_import(crud.price_book(session), prices)
    if not dry_run and plan.add:
        publish(lambda session: crud.add_prices(session, prices=plan.add))
    for conflict in plan.conflicts:
        typer.secho(f"left as it is (other rates on that day): {conflict}", err=True)
    verb = "would add" if dry_run else "added"
    typer.echo(
        f"litellm {version}: {verb} {len(plan.add)}, unchanged {len(plan.unchanged)}, "
        f"conflicts {len(plan.conflicts)}"
    )


@prices_app.command("list")
def prices_list(model: ModelFilter = None) -> None:
    """The price book, oldest entry first per model."""
    from gateway.db import crud

    with sessions_for(settings())() as session:
        book = crud.price_book(session)
    typer.echo("model\teffective_from\tinput\tcache_read\tcache_write\toutput\tcurrency\tsource")
    for p in book.entries(model):
        typer.echo(
            f"{p.model}\t{p.effective_from:%Y-%m-%dT%H:%M:%SZ}\t{p.input}\t{p.cache_read}"
            f"\t{'' if p.cache_write is None else p.cache_write}\t{p.output}"
            f"\t{p.currency}\t{p.source}"
        )
