"""predictions.stream is named for what it holds: the deployable it was queued for

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 01:35:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column("predictions", "stream", new_column_name="target")


def downgrade() -> None:
    op.alter_column("predictions", "target", new_column_name="stream")
