"""Alembic migrations driven from code, for the CLI and for tests."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError

from gateway.db.session import normalise_url
from gateway.errors import InvalidRequest

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic config with kvgate's migrations, for the database at ``url``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would eat '%' in passwords.
    config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``; InvalidRequest if there is none."""
    try:
        command.upgrade(alembic_config(url), revision)
    except CommandError as error:  # an unknown revision, named by the operator
        raise InvalidRequest(str(error)) from None


def downgrade(url: str, revision: str = "base") -> None:
    """Migrate the database at ``url`` down to ``revision``; InvalidRequest if there is none."""
    try:
        command.downgrade(alembic_config(url), revision)
    except CommandError as error:
        raise InvalidRequest(str(error)) from None
