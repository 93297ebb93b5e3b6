"""inference_servers: the registry of inference servers, each record one JSONB document

A new table only: processes of the earlier release never read or write it, so it is live-safe.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.create_table(
        "inference_servers",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("doc", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "registered_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name="pk_inference_servers"),
    )
    op.create_index(
        "ix_inference_servers_doc",
        "inference_servers",
        ["doc"],
        postgresql_using="gin",
        postgresql_ops={"doc": "jsonb_path_ops"},
    )
    op.create_index("ix_inference_servers_registered", "inference_servers", ["registered_at", "id"])


def downgrade() -> None:
    op.drop_table("inference_servers")
