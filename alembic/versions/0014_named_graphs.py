"""graphs: named graphs of blocks, with field mappings, registered by an account

A new table only: processes of the earlier release never read or write it, so it is live-safe.
The lock wait is bounded all the same (the foreign key takes a lock on ``accounts``).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.create_table(
        "graphs",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("account_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name="fk_graphs_account_id_accounts",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_graphs"),
        sa.UniqueConstraint("account_id", "name", name="uq_graphs_account_name"),
    )
    op.create_index("ix_graphs_account_created", "graphs", ["account_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_table("graphs")
