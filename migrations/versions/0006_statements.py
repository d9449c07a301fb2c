"""rollups count what statements count: 1-hour write tokens, priced completed interactions

``usage_hours`` gains ``cache_write_1h_tokens`` (so the dashboard's figures hold the same
sums as statement lines) and ``priced_completed_cells``; ``interaction_cells`` gains
``priced`` (a priced attempt completed the interaction in that cell), so cost per completed
interaction can be taken over priced interactions only. The rollups are rebuilt from the
requests by ``gateway.db.writer.rollups.rebuild``, the recorder's own code.

Revision ID: 0006_statements
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_statements"
down_revision: str | None = "0005_directory"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_hours", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("cache_write_1h_tokens", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("priced_completed_cells", sa.BigInteger(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("interaction_cells", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("priced", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    bind = op.get_bind()
    if bind.execute(sa.text("SELECT 1 FROM requests LIMIT 1")).first() is not None:
        from gateway.db.writer.rollups import rebuild

        rebuild(bind)


def downgrade() -> None:
    with op.batch_alter_table("interaction_cells", schema=None) as batch_op:
        batch_op.drop_column("priced")
    with op.batch_alter_table("usage_hours", schema=None) as batch_op:
        batch_op.drop_column("priced_completed_cells")
        batch_op.drop_column("cache_write_1h_tokens")
