"""hourly rollups for the dashboard

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Existing requests are folded in by ``gateway.db.writer.rollups.rebuild``: the same code the
recorder uses, so a migrated database and a fresh one hold identical rollups.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MONEY = sa.Numeric(precision=18, scale=9)


def _sums(*names: str) -> list[sa.Column]:  # type: ignore[type-arg]
    return [sa.Column(name, sa.BigInteger(), nullable=False) for name in names]


def upgrade() -> None:
    op.create_table(
        "usage_hours",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("price_id", sa.String(length=300), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        *_sums(
            "requests",
            "uncached_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "output_tokens",
        ),
        *[
            sa.Column(name, MONEY, nullable=False)
            for name in (
                "cost_uncached",
                "cost_cache_read",
                "cost_cache_write",
                "cost_output",
                "cost_total",
                "cost_uncached_equivalent",
            )
        ],
        *_sums(
            "completed_cells",
            "ceiling_requests",
            "ceiling_prompt_tokens",
            "ceiling_cache_read_tokens",
            "ceiling_cached_tokens",
            "avoidable_miss_tokens",
        ),
        sa.PrimaryKeyConstraint("hour", "tenant_id", "model", "price_id", "status"),
    )
    op.create_table(
        "replica_hours",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("upstream", sa.String(length=500), nullable=False),
        *_sums(
            "requests",
            "failed_requests",
            "prompt_tokens",
            "cache_read_tokens",
            "output_tokens",
            "predicted_requests",
            "predicted_cached_tokens",
            "predicted_cache_read_tokens",
            "ceiling_requests",
            "ceiling_prompt_tokens",
            "ceiling_cache_read_tokens",
            "ceiling_cached_tokens",
        ),
        sa.PrimaryKeyConstraint("hour", "model", "upstream"),
    )
    op.create_table(
        "ttft_hours",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("warm", sa.Boolean(), nullable=False),
        sa.Column("bucket", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "tenant_id", "model", "warm", "bucket"),
    )
    op.create_table(
        "interactions",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("interaction_id", sa.String(length=200), nullable=False),
        sa.Column("cells", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "interaction_id"),
    )
    op.create_table(
        "interaction_cells",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("interaction_id", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spans", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "interaction_id", "model", "hour"),
    )
    with op.batch_alter_table("interaction_cells", schema=None) as batch_op:
        batch_op.create_index(
            "ix_interaction_cells_spans_hour",
            ["hour"],
            unique=False,
            postgresql_where=sa.text("spans"),
            sqlite_where=sa.text("spans"),
        )
    bind = op.get_bind()
    if bind.execute(sa.text("SELECT 1 FROM requests LIMIT 1")).first() is not None:
        from gateway.db.writer.rollups import rebuild

        rebuild(bind)


def downgrade() -> None:
    with op.batch_alter_table("interaction_cells", schema=None) as batch_op:
        batch_op.drop_index("ix_interaction_cells_spans_hour")
    op.drop_table("interaction_cells")
    op.drop_table("interactions")
    op.drop_table("ttft_hours")
    op.drop_table("replica_hours")
    op.drop_table("usage_hours")
