"""ops unfinished account: the unfinished index carries the account beside the status and the
deployable, so the fairness page counts what waits per deployable and account from the index
alone (an index-only scan) instead of reading a heap page per waiting prediction.

It replaces ``ix_predictions_unfinished_target`` (same entries, same leading columns: the
overview's counts per deployable use it as they did the old one). Like 0019's, the index is
built inside the migration's transaction, so not ``CONCURRENTLY``: on a large table, build it
``CONCURRENTLY`` under this name beforehand and the migration finds it there.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 07:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNFINISHED = "status IN ('starting', 'processing')"


def upgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_predictions_unfinished_account ON predictions "
        f"(status, target, account_id) WHERE {UNFINISHED}"
    )
    op.execute("DROP INDEX IF EXISTS ix_predictions_unfinished_target")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_predictions_unfinished_target ON predictions "
        f"(status, target) WHERE {UNFINISHED}"
    )
    op.execute("DROP INDEX IF EXISTS ix_predictions_unfinished_account")
