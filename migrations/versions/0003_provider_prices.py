"""provider prices: 1-hour cache writes, long-context and tier rates; request tier and 1h writes

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("prices", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("cache_write_1h", sa.Numeric(precision=18, scale=9), nullable=True)
        )
        batch_op.add_column(sa.Column("variants", sa.Text(), nullable=True))
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("cache_write_1h_tokens", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("service_tier", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("service_tier")
        batch_op.drop_column("cache_write_1h_tokens")
    with op.batch_alter_table("prices", schema=None) as batch_op:
        batch_op.drop_column("variants")
        batch_op.drop_column("cache_write_1h")
