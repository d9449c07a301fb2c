"""a statement's lines, rolled up by the writer

- ``statement_lines``: per UTC day × tenant × model × endpoint × price entry × rate set ×
  usage source (``''``: no endpoint kept, unpriced, no rate set kept), the attempts' sums
  and the line's distinct completed interactions, so a month's statement reads about a
  hundred rows instead of every request of the month (840,000 of them for one tenant at
  10,000,000 records: 3.9 s).
- ``statement_cells``: (line, interaction) of every completed attempt, which the writer
  counts each line's completed interactions by.

Existing requests are folded in by three statements (``gateway.db.writer.lines.backfill``).

- ``ix_requests_tenant_started`` (Postgres): plain again. 0017 made it carry a statement's
  columns so that statements read it alone; statements no longer read the requests (those
  split by end user or tag read columns it never carried), and the 2.3 GB it took at
  10,000,000 records cost every insert. Remade under an exclusive lock (seconds at
  1,000,000 records).

Revision ID: 0019_statement_lines
Revises: 0018_bigint_tokens
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_statement_lines"
down_revision: str | None = "0018_bigint_tokens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MONEY = sa.Numeric(precision=18, scale=9)
KEYS = ("tenant_id", "day", "model", "endpoint", "price_id", "rate_class", "usage_source")
TOKENS = (
    "uncached_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "output_tokens",
)
COSTS = (
    "cost_uncached",
    "cost_cache_read",
    "cost_cache_write",
    "cost_output",
    "cost_total",
    "cost_uncached_equivalent",
)
SUMMED = ("requests", *TOKENS, "completed_interactions")
INDEX = "ix_requests_tenant_started"
# 0017's INCLUDE list, for the downgrade.
COVERED = [
    *("model", "endpoint", "price_id", "rate_class", "usage_source", "status"),
    *("interaction_id", *TOKENS, *COSTS),
]


def upgrade() -> None:
    op.create_table(
        "statement_lines",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("endpoint", sa.String(length=40), nullable=False),
        sa.Column("price_id", sa.String(length=300), nullable=False),
        sa.Column("rate_class", sa.String(length=32), nullable=False),
        sa.Column("usage_source", sa.String(length=16), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in SUMMED),
        *(sa.Column(name, MONEY, nullable=False) for name in COSTS),
        sa.UniqueConstraint(*KEYS, name="uq_statement_lines_key"),
    )
    op.create_table(
        "statement_cells",
        sa.Column("line_id", sa.BigInteger(), nullable=False),
        sa.Column("interaction_id", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("line_id", "interaction_id"),
    )
    from gateway.db.writer.lines import backfill

    backfill(op.get_bind())
    _remake_index([])


def _remake_index(include: list[str]) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(INDEX, table_name="requests")
    op.create_index(INDEX, "requests", ["tenant_id", "started_at"], postgresql_include=include)


def downgrade() -> None:
    _remake_index(COVERED)
    op.drop_table("statement_cells")
    op.drop_table("statement_lines")
