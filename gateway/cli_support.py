"""What every ``kvgate`` command uses: its settings, its database, and how it fails."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from gateway.config import Settings

if TYPE_CHECKING:
    from gateway.db.session import SessionFactory


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


def fail(message: str) -> NoReturn:
    """Print an error and exit with status 2 (a usage or data error)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)
