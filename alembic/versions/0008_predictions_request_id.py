"""predictions.request_id: the X-Request-Id of the request that created the prediction

The api stores it with the prediction, so the director's log lines about that prediction
carry the id the client (or the api) gave the request.

Expand only and live-safe: a nullable column without a default changes only the catalog (no
table rewrite, no scan); the lock it takes on ``predictions`` is held for that moment, and a
lock wait is bounded so that a long transaction elsewhere fails the migration instead of
queueing every writer behind it. Processes of the earlier release insert without it (NULL)
and read rows by column name.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("predictions", sa.Column("request_id", sa.String(length=128), nullable=True))


def downgrade() -> None:
    op.drop_column("predictions", "request_id")
