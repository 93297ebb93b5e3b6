"""inference_servers heartbeats and registry_blocks: a registered server's last heartbeat and
how long it stays alive without the next, and the blocks each cluster's gateway publishes

New nullable columns and a new table only: processes of the earlier release neither read nor
write them, so it is live-safe.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-10 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column(
        "inference_servers", sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("inference_servers", sa.Column("heartbeat_grace", sa.Float(), nullable=True))
    op.create_table(
        "registry_blocks",
        sa.Column("server_id", sa.String(length=36), nullable=False),
        sa.Column("block_id", sa.String(length=32), nullable=False),
        sa.Column("metadata", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("public", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["server_id"],
            ["inference_servers.id"],
            name="fk_registry_blocks_server",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("server_id", "block_id", name="pk_registry_blocks"),
    )
    op.create_index("ix_registry_blocks_block", "registry_blocks", ["block_id"])
    op.create_index(
        "ix_registry_blocks_metadata",
        "registry_blocks",
        ["metadata"],
        postgresql_using="gin",
        postgresql_ops={"metadata": "jsonb_path_ops"},
    )


def downgrade() -> None:
    op.drop_table("registry_blocks")
    op.drop_column("inference_servers", "heartbeat_grace")
    op.drop_column("inference_servers", "heartbeat_at")
