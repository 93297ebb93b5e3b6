"""predictions: a partial index for the retention sweep (``files.retention``)

The sweep looks for finished predictions whose data is still kept, oldest first; the index
holds only those rows (``WHERE NOT data_removed``), so it stays small however many old
predictions the table keeps. Expand only and live-safe for processes of the earlier release,
which never read it. Building it holds writes to ``predictions`` for as long as the build takes
(every migration runs in one transaction, where ``CONCURRENTLY`` cannot); the lock wait is
bounded so that a long transaction elsewhere fails the migration instead of queueing every
writer behind it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 10:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.create_index(
        "ix_predictions_retention",
        "predictions",
        ["completed_at"],
        unique=False,
        postgresql_where="NOT data_removed",
    )


def downgrade() -> None:
    op.drop_index("ix_predictions_retention", table_name="predictions")
