"""the cost to serve a self-hosted model

- ``gpu_costs``: per vLLM deployment, dated from a whole UTC hour, what one replica costs
  per hour, how many replicas each hour is charged for, and the weight of an output token
  against an uncached prompt token (``prefill_decode_ratio``) that splits each hour's cost
  over its requests.

Revision ID: 0015_gpu_costs
Revises: 0014_adjustments
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_gpu_costs"
down_revision: str | None = "0014_adjustments"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MONEY = sa.Numeric(precision=18, scale=9)


def upgrade() -> None:
    op.create_table(
        "gpu_costs",
        sa.Column("deployment", sa.String(length=200), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("per_replica_hour", MONEY, nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("prefill_decode_ratio", MONEY, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("deployment", "effective_from"),
    )


def downgrade() -> None:
    op.drop_table("gpu_costs")
