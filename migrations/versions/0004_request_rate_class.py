"""request rate class: which of its price entry's rate sets a request was priced with

Rows recorded before this revision keep NULL (their statement lines show the entry's base
rates, as before).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rate_class", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("rate_class")
