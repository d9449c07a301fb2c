"""cached tokens by cache tier: per request where the replica reports them, per replica-hour

requests gains cache_read_host_tokens and cache_read_disk_tokens (NULL: the replica did
not say; rows recorded before this revision keep NULL). replica_hours gains the sums the
dashboard's tier figure reads; no existing row reported tiers, so they start at 0 and no
rebuild is needed.

Revision ID: 0009_tiers
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_tiers"
down_revision: str | None = "0007_ceiling_kind"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REPLICA_SUMS = (
    "tier_requests",
    "tier_cache_read_tokens",
    "host_cached_tokens",
    "disk_cached_tokens",
)


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cache_read_host_tokens", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("cache_read_disk_tokens", sa.Integer(), nullable=True))
    with op.batch_alter_table("replica_hours", schema=None) as batch_op:
        for name in REPLICA_SUMS:
            batch_op.add_column(
                sa.Column(name, sa.BigInteger(), server_default="0", nullable=False)
            )


def downgrade() -> None:
    with op.batch_alter_table("replica_hours", schema=None) as batch_op:
        for name in reversed(REPLICA_SUMS):
            batch_op.drop_column(name)
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("cache_read_disk_tokens")
        batch_op.drop_column("cache_read_host_tokens")
