"""the endpoint of each request

- ``requests.endpoint``: the inference endpoint's path (``/v1/chat/completions``,
  ``/v1/embeddings``, ``/v1/responses``, ``/v1/messages``…), so statements show each
  endpoint's requests as their own lines. NULL for requests recorded before this revision
  (kvgate did not keep it; chat and completions both were served then).

Revision ID: 0013_endpoints
Revises: 0012_budgets
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_endpoints"
down_revision: str | None = "0012_budgets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("endpoint", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("endpoint")
