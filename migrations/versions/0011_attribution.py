"""cost attribution: end users and tags

- ``requests`` gains ``end_user`` (the id the client named in OpenAI's ``user``) and
  ``tags`` (a JSON object of strings, from X-Kvgate-Tags or ``metadata``); NULL when the
  request named none, and for every request recorded before this revision.

Revision ID: 0011_attribution
Revises: 0010_breakers
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_attribution"
down_revision: str | None = "0010_breakers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("end_user", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("tags", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("tags")
        batch_op.drop_column("end_user")
