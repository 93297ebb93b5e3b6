"""models and deployments belong to accounts; deployments' visibility; grants; priority

Expand only, so apis and directors of the earlier release keep working during a rolling
upgrade:

- every owner name of a model or deployment that names no account gets one (no token:
  ``conduit admin create-account NAME`` reuses it by name and gives it one), then
  ``models.owner`` and ``deployments.owner`` become foreign keys to ``accounts.name``;
- ``deployments.visibility``, ``public`` for every existing row so that nothing that worked
  stops working. The column's default stays ``public`` for rows the earlier release inserts;
  ``conduit admin create-deployment`` of this release makes new deployments private;
- ``grants``: an account may use a private model or deployment it does not own;
- ``accounts.may_use_high_priority`` and ``deployments.allow_high_priority`` (false): who may
  have ``X-Priority: high`` honoured.

Live-safe: the predictions table is not touched; the new columns have constant defaults (no
table rewrite); adding the foreign keys scans only the small catalog tables and blocks only
their writers (``create-account``, ``create-model``...) for that moment, never a read (token
lookups, model reads). A lock wait is bounded, so a long transaction elsewhere fails the
migration instead of queueing every writer behind it.

While the earlier release still runs, its ``create-model`` for an owner name that has no
account is refused by the foreign key: create the account first.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 10:00:00
"""

import base64
import os
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OWNED = ("models", "deployments")


def _webhook_secret() -> str:
    """An account's signing secret, in the format the release writes (``whsec_`` + 32 bytes)."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    _accounts_for_owners()
    for table in _OWNED:
        op.create_foreign_key(f"fk_{table}_owner_accounts", table, "accounts", ["owner"], ["name"])
    op.add_column(
        "deployments",
        sa.Column("visibility", sa.String(length=20), server_default="public", nullable=False),
    )
    op.add_column(
        "accounts",
        sa.Column("may_use_high_priority", sa.Boolean(), server_default="false", nullable=False),
    )
    op.add_column(
        "deployments",
        sa.Column("allow_high_priority", sa.Boolean(), server_default="false", nullable=False),
    )
    op.create_table(
        "grants",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("account_id", sa.BigInteger(), nullable=False),
        sa.Column("model_id", sa.BigInteger(), nullable=True),
        sa.Column("deployment_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "(model_id IS NULL) <> (deployment_id IS NULL)", name="ck_grants_model_or_deployment"
        ),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name="fk_grants_account_id_accounts",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name="fk_grants_model_id_models", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name="fk_grants_deployment_id_deployments",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_grants"),
        sa.UniqueConstraint("account_id", "model_id", name="uq_grants_account_model"),
        sa.UniqueConstraint("account_id", "deployment_id", name="uq_grants_account_deployment"),
    )


def _accounts_for_owners() -> None:
    """An account, without a token, for every owner name that has none."""
    bind = op.get_bind()
    missing = bind.execute(
        sa.text(
            "SELECT owner FROM models UNION SELECT owner FROM deployments "
            "EXCEPT SELECT name FROM accounts"
        )
    ).scalars()
    insert = sa.text(
        "INSERT INTO accounts (name, webhook_secret) VALUES (:name, :secret) "
        "ON CONFLICT (name) DO NOTHING"
    )
    for name in sorted(missing):
        bind.execute(insert, {"name": name, "secret": _webhook_secret()})


def downgrade() -> None:
    op.drop_table("grants")
    op.drop_column("deployments", "allow_high_priority")
    op.drop_column("accounts", "may_use_high_priority")
    op.drop_column("deployments", "visibility")
    for table in _OWNED:
        op.drop_constraint(f"fk_{table}_owner_accounts", table, type_="foreignkey")
    # The accounts made for owners stay: they may have tokens and predictions by now.
