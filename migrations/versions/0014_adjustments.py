"""price corrections: adjustments beside the records

- ``price_adjustments``: what a correction of a price entry changes per tenant × UTC day ×
  model (billed, corrected, delta), who made it, when and why; the requests keep the cost
  they were recorded with. One correction (``correction_key``: the entry and its
  corrected rates) names what made each row.

Revision ID: 0014_adjustments
Revises: 0013_endpoints
Create Date: 2026-12-15
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_adjustments"
down_revision: str | None = "0013_endpoints"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MONEY = sa.Numeric(precision=18, scale=9)


def upgrade() -> None:
    op.create_table(
        "price_adjustments",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("correction_key", sa.String(length=64), nullable=False),
        sa.Column("price_id", sa.String(length=300), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("billed", MONEY, nullable=False),
        sa.Column("corrected", MONEY, nullable=False),
        sa.Column("delta", MONEY, nullable=False),
        sa.Column("corrected_rates", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_price_adjustments_tenant_day", "price_adjustments", ["tenant_id", "day"], unique=False
    )
    op.create_index(
        "ix_price_adjustments_key", "price_adjustments", ["correction_key"], unique=False
    )
    op.create_index(
        "ix_price_adjustments_entry",
        "price_adjustments",
        ["price_id", "tenant_id", "day", "model"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_price_adjustments_entry", table_name="price_adjustments")
    op.drop_index("ix_price_adjustments_key", table_name="price_adjustments")
    op.drop_index("ix_price_adjustments_tenant_day", table_name="price_adjustments")
    op.drop_table("price_adjustments")
