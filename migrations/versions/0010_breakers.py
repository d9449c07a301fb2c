"""prefix breakers and replica reconciliation

- ``requests`` gains ``break_tokens``, ``lost_tokens``, ``break_early`` and
  ``break_context`` (NULL: no break, or recorded before kvgate looked for them).
- ``tenants`` gains ``break_context``: whether the text around a tenant's breaks is kept
  (off for everyone).
- ``break_hours``: the breaks rolled up per hour × tenant × model × price entry × rate set ×
  offset × early; empty at first (no request before this revision has a break), so
  nothing is rebuilt.
- ``replica_samples``: the replicas' own counters, read by the gateways' load pollers.

Revision ID: 0010_breakers
Revises: 0007_ceiling_kind
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_breakers"
down_revision: str | None = "0009_tiers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("break_tokens", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("lost_tokens", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("break_early", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("break_context", sa.Text(), nullable=True))
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("break_context", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    op.create_table(
        "break_hours",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("price_id", sa.String(length=300), nullable=False),
        sa.Column("rate_class", sa.String(length=32), nullable=False),
        sa.Column("break_tokens", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("early", sa.Boolean(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("lost_tokens", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "hour", "tenant_id", "model", "price_id", "rate_class", "break_tokens", "early"
        ),
    )
    op.create_table(
        "replica_samples",
        sa.Column("upstream", sa.String(length=500), nullable=False),
        sa.Column("sampler", sa.String(length=200), nullable=False),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("prefix_cache_queries", sa.BigInteger(), nullable=False),
        sa.Column("prefix_cache_hits", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("generation_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("upstream", "sampler", "sampled_at"),
    )


def downgrade() -> None:
    op.drop_table("replica_samples")
    op.drop_table("break_hours")
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("break_context")
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("break_context")
        batch_op.drop_column("break_early")
        batch_op.drop_column("lost_tokens")
        batch_op.drop_column("break_tokens")
