"""``kvgate budgets`` and ``kvgate limits``: spend control from the command line. Every
change applies on every gateway sharing the database once the command returns."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gateway.cli_support import publish, sessions_for, settings

if TYPE_CHECKING:
    from gateway.db.session import Session

budgets_app = typer.Typer(help="Budgets: what a scope may spend per period.", no_args_is_help=True)
limits_app = typer.Typer(help="Rate limits: requests and tokens per minute.", no_args_is_help=True)
SCOPES = (
    "tenant:NAME, key:KEY_ID, user:TENANT/USER, tag:TENANT/KEY=VALUE or interaction:TENANT "
    "(a cap on each interaction)"
)


def _optional(value: Any) -> str:
    return "-" if value is None else str(value)


def _row(*values: Any) -> None:
    """Print one line of a listing: the values tab-separated, '-' for a missing one."""
    typer.echo("\t".join(_optional(value) for value in values))


def _delete(what: str, ident: str, remove: Callable[[Session], object]) -> None:
    """Remove a budget or a rate limit on every gateway, and say so."""
    publish(remove)
    typer.echo(f"{what} {ident} deleted")


@budgets_app.command("set")
def budgets_set(
    scope: Annotated[str, typer.Option(help=SCOPES)],
    limit: Annotated[str, typer.Option(help="Most the scope may spend per period (USD).")],
    period: Annotated[str, typer.Option(help="day, week, month or total.")],
    timezone: Annotated[str, typer.Option(help="Where periods turn over (IANA).")] = "UTC",
    alert_at: Annotated[
        str, typer.Option(help="Alert thresholds, shares of the limit.")
    ] = "0.5,0.8,1.0",
    webhook: Annotated[str | None, typer.Option(help="Where alerts are POSTed.")] = None,
) -> None:
    """Set a budget (the same scope and period again changes it); prints its id."""
    from gateway.budgets import Period, parse_alerts, parse_limit, parse_scope
    from gateway.db import spend
    from gateway.errors import InvalidRequest

    parsed_scope, amount, alerts = parse_scope(scope), parse_limit(limit), parse_alerts(alert_at)
    try:
        kind = Period(period)
    except ValueError:
        raise InvalidRequest(
            f"--period must be day, week, month or total, not {period!r}"
        ) from None
    budget = publish(
        lambda session: spend.set_budget(
            session,
            scope=parsed_scope,
            limit=amount,
            period=kind,
            timezone=timezone,
            alert_at=alerts,
            webhook=webhook,
        )
    )
    typer.echo(f"budget {budget.id}: {budget.scope} {budget.limit} per {budget.period}")


@budgets_app.command("list")
def budgets_list() -> None:
    """Every budget with its current period's spend (tab-separated)."""
    from gateway.db import spend

    at = datetime.now(UTC)
    typer.echo("id\tscope\tlimit\tperiod\ttimezone\talert_at\tspent\treserved\twebhook")
    with sessions_for(settings())() as session:
        for budget in spend.list_budgets(session):
            start, _ = budget.bounds(at)
            spent, reserved = spend.counter(session, budget.id, start)
            alerts = ",".join(str(t) for t in budget.alert_at)
            _row(
                budget.id,
                budget.scope,
                budget.limit,
                budget.period,
                budget.timezone,
                alerts,
                spent,
                reserved,
                budget.webhook,
            )


@budgets_app.command("delete")
def budgets_delete(budget_id: Annotated[str, typer.Argument(help="Budget id (bud_...).")]) -> None:
    """Remove a budget."""
    from gateway.db import spend

    _delete("budget", budget_id, lambda session: spend.delete_budget(session, budget_id=budget_id))


@limits_app.command("set")
def limits_set(
    scope: Annotated[str, typer.Option(help="tenant:NAME or key:KEY_ID.")],
    requests_per_minute: Annotated[int | None, typer.Option(min=0)] = None,
    tokens_per_minute: Annotated[int | None, typer.Option(min=0)] = None,
) -> None:
    """Set a rate limit (the same scope again changes it); prints its id."""
    from gateway.budgets import LIMITABLE, parse_scope
    from gateway.db import spend

    parsed = parse_scope(scope, allowed=LIMITABLE)
    limit = publish(
        lambda session: spend.set_limit(
            session,
            scope=parsed,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
        )
    )
    typer.echo(
        f"limit {limit.id}: {limit.scope} {_optional(limit.requests_per_minute)} requests,"
        f" {_optional(limit.tokens_per_minute)} tokens per minute"
    )


@limits_app.command("list")
def limits_list() -> None:
    """Every rate limit (tab-separated)."""
    from gateway.db import spend

    typer.echo("id\tscope\trequests_per_minute\ttokens_per_minute")
    with sessions_for(settings())() as session:
        for limit in spend.list_limits(session):
            _row(limit.id, limit.scope, limit.requests_per_minute, limit.tokens_per_minute)


@limits_app.command("delete")
def limits_delete(limit_id: Annotated[str, typer.Argument(help="Limit id (rl_...).")]) -> None:
    """Remove a rate limit."""
    from gateway.db import spend

    _delete("limit", limit_id, lambda session: spend.delete_limit(session, limit_id=limit_id))
