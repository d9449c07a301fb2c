"""traffic per deployment and endpoint, rolled up; indexes for cost attribution

- ``deployment_hours``: the attempts' tokens by class and cost per UTC hour × tenant ×
  model × deployment × price entry × endpoint (``''``: unpriced, or no endpoint kept), so
  the cost to serve and the traffic by endpoint no longer read every request of the
  period. Existing requests are folded in by one grouped statement
  (``gateway.db.writer.deployments.backfill``).
- ``requests``: partial indexes on (tenant_id, started_at) of the requests that name an
  end user and of those that carry tags, the only rows cost attribution reads.
- ``ix_interaction_cells_spans_hour`` covers what the repeats of spanning interactions
  are counted from (hour, tenant, model, interaction, priced), so they are read from the
  index alone.

Revision ID: 0016_deployment_hours
Revises: 0015_gpu_costs
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_deployment_hours"
down_revision: str | None = "0015_gpu_costs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MONEY = sa.Numeric(precision=18, scale=9)
PARTIAL = {"end_user": "end_user IS NOT NULL", "tags": "tags IS NOT NULL"}


def upgrade() -> None:
    op.create_table(
        "deployment_hours",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("deployment", sa.String(length=200), nullable=False),
        sa.Column("price_id", sa.String(length=300), nullable=False),
        sa.Column("endpoint", sa.String(length=40), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("uncached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_write_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_total", MONEY, nullable=False),
        sa.PrimaryKeyConstraint("hour", "tenant_id", "model", "deployment", "price_id", "endpoint"),
    )
    for name, where in PARTIAL.items():
        op.create_index(
            f"ix_requests_{name}",
            "requests",
            ["tenant_id", "started_at"],
            postgresql_where=sa.text(where),
            sqlite_where=sa.text(where),
        )
    _spans_index(["hour", "tenant_id", "model", "interaction_id", "priced"])
    from gateway.db.writer.deployments import backfill

    backfill(op.get_bind())


def _spans_index(columns: list[str]) -> None:
    op.drop_index("ix_interaction_cells_spans_hour", table_name="interaction_cells")
    op.create_index(
        "ix_interaction_cells_spans_hour",
        "interaction_cells",
        columns,
        postgresql_where=sa.text("spans"),
        sqlite_where=sa.text("spans"),
    )


def downgrade() -> None:
    _spans_index(["hour"])
    for name in PARTIAL:
        op.drop_index(f"ix_requests_{name}", table_name="requests")
    op.drop_table("deployment_hours")
