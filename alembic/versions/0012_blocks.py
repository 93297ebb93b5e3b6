"""blocks: deployments and model versions published as blocks for the inference gateway

A new table only: processes of the earlier release never read or write it, so it is live-safe.
The lock wait is bounded all the same (the foreign keys take locks on ``accounts``,
``deployments`` and ``versions``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.create_table(
        "blocks",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("account_id", sa.BigInteger(), nullable=False),
        sa.Column("deployment_id", sa.BigInteger(), nullable=True),
        sa.Column("version_id", sa.String(length=64), nullable=True),
        sa.Column(
            "metadata",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default="{}",
            nullable=False,
        ),
        sa.Column("synchronous", sa.Boolean(), server_default="false", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "(deployment_id IS NULL) <> (version_id IS NULL)",
            name="ck_blocks_deployment_or_version",
        ),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name="fk_blocks_account_id_accounts",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name="fk_blocks_deployment_id_deployments",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["versions.id"],
            name="fk_blocks_version_id_versions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_blocks"),
    )
    op.create_index("ix_blocks_account_created", "blocks", ["account_id", "created_at", "id"])
    op.create_index("ix_blocks_deployment_id", "blocks", ["deployment_id"])
    op.create_index("ix_blocks_version_id", "blocks", ["version_id"])
    # Search filters blocks on their metadata (containment and JSON path queries).
    op.create_index(
        "ix_blocks_metadata",
        "blocks",
        ["metadata"],
        postgresql_using="gin",
        postgresql_ops={"metadata": "jsonb_path_ops"},
    )


def downgrade() -> None:
    op.drop_table("blocks")
