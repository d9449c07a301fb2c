"""statements read from the index alone: ix_requests_tenant_started covers their columns

A tenant's statement (the billing API's and the dashboard's download) reads the tenant's
requests of the period through ``ix_requests_tenant_started``. A tenant's rows are spread
over the whole table, so that read fetched nearly every heap page of the month (30,376 for
83,224 rows at 1,000,000 records). On Postgres the index now carries the statement's
columns (``INCLUDE``), so the statement is an index-only scan of the tenant's range. The
key is unchanged, so every query that used the index still does. SQLite: unchanged.

Revision ID: 0017_statement_index
Revises: 0016_deployment_hours
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017_statement_index"
down_revision: str | None = "0016_deployment_hours"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ix_requests_tenant_started"
# What a statement reads of a request (gateway/db/statements.py); models.py says the same.
STATEMENT_COLUMNS = [
    "model",
    "endpoint",
    "price_id",
    "rate_class",
    "usage_source",
    "status",
    "interaction_id",
    "uncached_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "output_tokens",
    "cost_uncached",
    "cost_cache_read",
    "cost_cache_write",
    "cost_output",
    "cost_total",
    "cost_uncached_equivalent",
]


def _remake(include: list[str]) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(NAME, table_name="requests")
    op.create_index(NAME, "requests", ["tenant_id", "started_at"], postgresql_include=include)


def upgrade() -> None:
    _remake(STATEMENT_COLUMNS)


def downgrade() -> None:
    _remake([])
