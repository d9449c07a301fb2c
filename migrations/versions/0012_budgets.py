"""spend control: budgets, rate limits and their shared counters

- ``budgets``: a limit per period on a scope (tenant, key, each interaction of a tenant).
- ``budget_counters``: per budget × subject (an interaction, or '') × period: settled
  spend and reserved amounts, charged by conditional UPDATEs.
- ``budget_holds``: what each admitted request holds reserved, until it is settled (or,
  its gateway gone, swept when it expires).
- ``budget_alerts``: each threshold crossed once per budget, subject and period, with its
  webhook delivery status.
- ``rate_limits`` and ``rate_windows``: requests and tokens per minute, counted per UTC
  minute.

Revision ID: 0012_budgets
Revises: 0011_attribution
Create Date: 2026-12-10
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_budgets"
down_revision: str | None = "0011_attribution"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MONEY = sa.Numeric(precision=18, scale=9)


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("scope_kind", sa.String(length=16), nullable=False),
        sa.Column("scope_value", sa.String(length=300), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=True),
        sa.Column("limit", MONEY, nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("alert_at", sa.String(length=200), nullable=False),
        sa.Column("webhook", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_budgets_tenant_id"), "budgets", ["tenant_id"], unique=False)
    op.create_table(
        "budget_counters",
        sa.Column("budget_id", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spent", MONEY, nullable=False),
        sa.Column("reserved", MONEY, nullable=False),
        sa.PrimaryKeyConstraint("budget_id", "subject", "period_start"),
    )
    op.create_table(
        "budget_holds",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("budget_id", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("amount", MONEY, nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "budget_id"),
    )
    op.create_index("ix_budget_holds_expires_at", "budget_holds", ["expires_at"], unique=False)
    op.create_table(
        "budget_alerts",
        sa.Column("budget_id", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("threshold", sa.String(length=16), nullable=False),
        sa.Column("spent", MONEY, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("budget_id", "subject", "period_start", "threshold"),
    )
    op.create_table(
        "rate_limits",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("scope_kind", sa.String(length=16), nullable=False),
        sa.Column("scope_value", sa.String(length=300), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=True),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_rate_limits_tenant_id"), "rate_limits", ["tenant_id"], unique=False)
    op.create_table(
        "rate_windows",
        sa.Column("limit_id", sa.String(length=64), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("limit_id", "window_start"),
    )


def downgrade() -> None:
    # The change kinds 'budgets' and 'limits' are made by their first change (bump).
    op.execute("DELETE FROM changes WHERE kind IN ('budgets', 'limits')")
    op.drop_table("rate_windows")
    op.drop_index(op.f("ix_rate_limits_tenant_id"), table_name="rate_limits")
    op.drop_table("rate_limits")
    op.drop_table("budget_alerts")
    op.drop_index("ix_budget_holds_expires_at", table_name="budget_holds")
    op.drop_table("budget_holds")
    op.drop_table("budget_counters")
    op.drop_index(op.f("ix_budgets_tenant_id"), table_name="budgets")
    op.drop_table("budgets")
