"""What every ``kvgate`` command uses: its settings, its database, and how it fails."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer

from gateway.config import Settings

if TYPE_CHECKING:
    from gateway.db.session import Session, SessionFactory

T = TypeVar("T")


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


def day(text: str, *, option: str) -> date:
    """A UTC day given as YYYY-MM-DD; anything else fails (exit 2) naming the option."""
    try:
        return date.fromisoformat(text)
    except ValueError:
        fail(f"{option} must be a day, YYYY-MM-DD, not {text!r}")
