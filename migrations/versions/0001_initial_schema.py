"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "prices",
        sa.Column("id", sa.String(length=300), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("cache_read", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("cache_write", sa.Numeric(precision=18, scale=9), nullable=True),
        sa.Column("output", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("currency", sa.String(length=8), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("captured_on", sa.Date(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("prices", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_prices_model"), ["model"], unique=False)

    op.create_table(
        "requests",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("api_key_id", sa.String(length=64), nullable=False),
        sa.Column("interaction_id", sa.String(length=200), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("deployment", sa.String(length=200), nullable=False),
        sa.Column("upstream", sa.String(length=500), nullable=False),
        sa.Column("policy", sa.String(length=50), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_token_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("finish_reason", sa.String(length=50), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("uncached_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_read_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_write_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("usage_source", sa.String(length=16), nullable=False),
        sa.Column("predicted_cached_tokens", sa.Integer(), nullable=True),
        sa.Column("ceiling_cached_tokens", sa.Integer(), nullable=True),
        sa.Column("price_id", sa.String(length=300), nullable=True),
        sa.Column("cost_uncached", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("cost_cache_read", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("cost_cache_write", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("cost_output", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("cost_total", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("cost_uncached_equivalent", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.PrimaryKeyConstraint("request_id"),
    )
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.create_index("ix_requests_interaction", ["interaction_id"], unique=False)
        batch_op.create_index("ix_requests_model_started", ["model", "started_at"], unique=False)
        batch_op.create_index("ix_requests_started", ["started_at"], unique=False)
        batch_op.create_index(
            "ix_requests_tenant_started", ["tenant_id", "started_at"], unique=False
        )

    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("cache_group", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash"),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_tenant_id"), ["tenant_id"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant_id"))

    op.drop_table("api_keys")
    op.drop_table("tenants")
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_index("ix_requests_tenant_started")
        batch_op.drop_index("ix_requests_started")
        batch_op.drop_index("ix_requests_model_started")
        batch_op.drop_index("ix_requests_interaction")

    op.drop_table("requests")
    with op.batch_alter_table("prices", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_prices_model"))

    op.drop_table("prices")
