"""a request's token counts are 64-bit on Postgres

A replica or provider that reports more than 2,147,483,647 tokens of one class in one
answer was billed for them in the answer, but Postgres refused the record (``integer out of
range``): the writer set it aside and no statement showed it. The token columns of
``requests`` are now ``bigint``, as the rollups' sums already were. On Postgres this
rewrites the table and its indexes, under an exclusive lock (about a minute per
10,000,000 rows on two cores). SQLite's integers are 64-bit already: its columns are
declared anew only where the schema is compared, so nothing there is rewritten.

Revision ID: 0018_bigint_tokens
Revises: 0017_statement_index
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_bigint_tokens"
down_revision: str | None = "0017_statement_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKEN_COLUMNS = (
    "uncached_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "output_tokens",
    "cache_write_1h_tokens",
    "predicted_cached_tokens",
    "ceiling_cached_tokens",
    "cache_read_host_tokens",
    "cache_read_disk_tokens",
    "break_tokens",
    "lost_tokens",
)


def _retype(type_name: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # One statement, so that the table and its indexes are rewritten once, not per column.
    clauses = ", ".join(f"ALTER COLUMN {c} TYPE {type_name}" for c in TOKEN_COLUMNS)
    op.execute(sa.text(f"ALTER TABLE requests {clauses}"))


def upgrade() -> None:
    _retype("bigint")


def downgrade() -> None:
    _retype("integer")
