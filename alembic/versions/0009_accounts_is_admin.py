"""accounts.is_admin: operators' accounts, which may read the fleet (``GET /v1/fleet``)

Expand only and live-safe: a NOT NULL column with a constant default changes only the catalog
(Postgres 11+ stores the default, no table rewrite); the lock wait is bounded so that a long
transaction elsewhere fails the migration instead of queueing every writer behind it.
Processes of the earlier release insert accounts without it (false: not an admin).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column(
        "accounts",
        sa.Column("is_admin", sa.Boolean(), server_default="false", nullable=False),
    )


def downgrade() -> None:
    op.drop_column("accounts", "is_admin")
