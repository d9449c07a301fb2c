"""ceiling kind: whether a request's ceiling was exact; ceilings at least what was achieved

- ``requests.ceiling_exact``: whether the router counted the request's predicted and ceiling
  cached tokens in the replica's own tokens (a tokenizer) or estimated them from character
  blocks (text mode). NULL on rows recorded before: their kind is not known, and figures
  call such ceilings approximate.
- ``usage_hours`` and ``replica_hours`` gain ``exact_ceiling_requests``: of the requests that
  carry a ceiling, those whose ceiling was exact (0 for what is already there).
- A ceiling below the cached tokens its replica reported is raised to them, as the recorder
  now stores it (``gateway.accounting.store.stored_ceiling``), and the rollups are rebuilt
  from the requests when any was, so no stored figure shows an efficiency above 100 %.
  The downgrade keeps the raised ceilings: the router's lower count was never right.

Revision ID: 0007_ceiling_kind
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_ceiling_kind"
down_revision: str | None = "0006_statements"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLLUPS = ("usage_hours", "replica_hours")


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ceiling_exact", sa.Boolean(), nullable=True))
    for table in ROLLUPS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column(
                    "exact_ceiling_requests",
                    sa.BigInteger(),
                    server_default=sa.text("0"),
                    nullable=False,
                )
            )
    bind = op.get_bind()
    raised = bind.execute(
        sa.text(
            "UPDATE requests SET ceiling_cached_tokens = cache_read_tokens"
            " WHERE ceiling_cached_tokens < cache_read_tokens"
        )
    ).rowcount
    if raised:
        from gateway.db.writer.rollups import rebuild

        rebuild(bind)


def downgrade() -> None:
    for table in ROLLUPS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("exact_ceiling_requests")
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("ceiling_exact")
