"""``kvgate breakers`` (where prompts break their interaction's cache reuse, ranked) and
``kvgate tenants set-capture`` (whether the text around a tenant's breaks is kept)."""

from __future__ import annotations

import sys
from datetime import UTC, date, datetime, timedelta
from typing import Annotated

import orjson
import typer

from gateway.cli_directory import tenants_app
from gateway.cli_support import (
    ModelFilter,
    TableOrJson,
    TenantOption,
    fail,
    one_of,
    publish,
    sessions_for,
    settings,
)

HOUR = timedelta(hours=1)


def moment(text: str, *, option: str) -> datetime:
    """A day (YYYY-MM-DD, its UTC midnight) or an ISO 8601 moment (UTC unless it says)."""
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), tzinfo=UTC)
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail(f"{option} must be a day (YYYY-MM-DD) or an ISO 8601 moment, not {text!r}")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def floor_hour(at: datetime) -> datetime:
    """The start of the UTC hour that ``at`` falls in."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def breakers(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant (by name).")] = None,
    model: ModelFilter = None,
    since: Annotated[
        str | None, typer.Option(help="From this UTC day or moment (its hour); default: all.")
    ] = None,
    format: TableOrJson = "table",
) -> None:
    """Prefix breakers: where prompts leave their interaction's previous request.

    Per tenant and model (by name), most tokens lost first: how often each position breaks, the
    tokens and dollars lost, and whether the break is early (first 10 % of the prompt or
    first two blocks).
    """
    from gateway.db import crud
    from gateway.db.figures.breaks import document, positions
    from gateway.db.figures.spend import Scope
    from gateway.db.lookups import tenant_names

    one_of(format, "table", "json", option="--format")
    lower = (
        floor_hour(moment(since, option="--since")) if since else datetime(2000, 1, 1, tzinfo=UTC)
    )
    upper = floor_hour(datetime.now(UTC)) + HOUR
    with sessions_for(settings())() as session:
        tenant_ids = (crud.get_tenant(session, name=tenant).id,) if tenant else ()
        found = positions(session, Scope(lower, upper, tenant_ids, (model,) if model else ()))
        names = tenant_names(session)
    found.sort(key=lambda p: (names.get(p.tenant_id, p.tenant_id), p.model, -p.lost_tokens))
    if format == "json":
        sys.stdout.buffer.write(
            orjson.dumps(
                [document(p, names.get(p.tenant_id, p.tenant_id)) for p in found],
                option=orjson.OPT_INDENT_2,
            )
            + b"\n"
        )
        return
    typer.echo("tenant\tmodel\tbreak_tokens\tearly\trequests\tlost_tokens\tlost_usd")
    for p in found:
        typer.echo(
            f"{names.get(p.tenant_id, p.tenant_id)}\t{p.model}\t{p.break_tokens}"
            f"\t{'early' if p.early else 'late'}\t{p.requests}\t{p.lost_tokens}\t{p.lost_usd}"
        )
        if p.context is not None:
            c = p.context
            typer.echo(f"\tat character {c['offset']} after {c['before']!r}:")
            typer.echo(f"\t  was {c['previous']!r}")
            typer.echo(f"\t  now {c['current']!r}")
    if not found:
        typer.echo("no prefix breaks recorded in this period", err=True)


@tenants_app.command("set-capture")
def tenants_set_capture(
    tenant: TenantOption,
    break_context: Annotated[
        str,
        typer.Option(
            "--break-context",
            help="on: keep the 48 characters either side of each prefix break, from both "
            "prompts (prompt text is stored); off: stop, and delete what was kept.",
        ),
    ],
) -> None:
    """Opt a tenant in to (or out of) keeping the text around its prefix breaks."""
    from gateway.db import crud

    one_of(break_context, "on", "off", option="--break-context")
    capture = break_context == "on"
    deleted = publish(lambda session: crud.set_break_context(session, name=tenant, capture=capture))
    if capture:
        typer.echo(f"tenant {tenant}: break context kept (shown to the tenant and operators)")
    else:
        typer.echo(f"tenant {tenant}: break context not kept; {deleted} kept context(s) deleted")
