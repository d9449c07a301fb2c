"""changes: a revision counter per kind of data the gateways hold in memory (keys, prices)

Revision ID: 0005_directory
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_directory"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    changes = op.create_table(
        "changes",
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("kind"),
    )
    op.bulk_insert(changes, [{"kind": "keys", "revision": 0}, {"kind": "prices", "revision": 0}])


def downgrade() -> None:
    op.drop_table("changes")
