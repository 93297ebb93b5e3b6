"""predictions.graph: the gateway graph run a prediction is a step of

A nullable column without a default: adding it rewrites nothing and takes its lock for an
instant (bounded all the same). Processes of the earlier release neither read nor write it.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column(
        "predictions", sa.Column("graph", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("predictions", "graph")
