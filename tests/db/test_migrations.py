"""One migration history for both databases: up from empty, down to empty, up again."""

from sqlalchemy import create_engine, inspect

from gateway.db.migrate import downgrade, upgrade
from gateway.db.models import Base
from gateway.db.session import normalise_url


def tables(url: str) -> set[str]:
    engine = create_engine(normalise_url(url))
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_from_empty_creates_every_model_table(empty_database_url: str) -> None:
    upgrade(empty_database_url)
    assert tables(empty_database_url) == set(Base.metadata.tables)


def test_downgrade_to_base_removes_everything_and_upgrade_again_works(
    empty_database_url: str,
) -> None:
    upgrade(empty_database_url)
    downgrade(empty_database_url, "base")
    assert tables(empty_database_url) == set()
    upgrade(empty_database_url)
    assert tables(empty_database_url) == set(Base.metadata.tables)


def test_migrated_schema_matches_the_models(empty_database_url: str) -> None:
    """Autogenerate finds nothing to do: models and migrations agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    upgrade(empty_database_url)
    engine = create_engine(normalise_url(empty_database_url))
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []
