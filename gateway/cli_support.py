"""What every ``kvgate`` command uses: its settings, its database, how it fails, and the
options more than one command takes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer

from gateway.config import Settings

if TYPE_CHECKING:
    from gateway.db.session import Session, SessionFactory

T = TypeVar("T")

# Options (and an argument) that several commands take, declared once; each command's
# parameter name is still its flag.
ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="Deployments file (kvgate.yaml).")
]
TenantOption = Annotated[str, typer.Option(help="Tenant name.")]
TenantArgument = Annotated[str, typer.Argument(help="Tenant name.")]
ModelFilter = Annotated[str | None, typer.Option(help="Only this model.")]
FirstDay = Annotated[str, typer.Option(help="First UTC day, YYYY-MM-DD.")]
LastDay = Annotated[str, typer.Option(help="Last UTC day, YYYY-MM-DD.")]
TableOrJson = Annotated[str, typer.Option(help="table or json.")]


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


def sessions_for(s: Settings) -> SessionFactory:
    """Sessions on the database the settings name."""
    from gateway.db.session import make_engine, session_factory

    return session_factory(make_engine(s.database_url))


def publish(work: Callable[[Session], T]) -> T:
    """Run a change in the database and return once every gateway applies it; warn about
    gateway processes that did not confirm it in time."""
    from gateway.db import changes

    result, published = changes.publish(sessions_for(settings()), work)
    late = published.unconfirmed
    if late:
        typer.secho(
            f"warning: not confirmed within {changes.CONFIRM_TIMEOUT_S:.0f} s by {len(late)}"
            f" gateway process(es) ({', '.join(late)}); they apply it when they do",
            fg=typer.colors.YELLOW,
            err=True,
        )
    return result


def fail(message: str) -> NoReturn:
    """Print an error and exit with status 2 (a usage or data error)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def one_of(value: str, *allowed: str, option: str) -> str:
    """``value`` if it is one of ``allowed``; anything else fails (exit 2) naming the option."""
    if value not in allowed:
        fail(f"{option} must be {' or '.join(allowed)}")
    return value


def day(text: str, *, option: str) -> date:
    """A UTC day given as YYYY-MM-DD; anything else fails (exit 2) naming the option."""
    try:
        return date.fromisoformat(text)
    except ValueError:
        fail(f"{option} must be a day, YYYY-MM-DD, not {text!r}")
