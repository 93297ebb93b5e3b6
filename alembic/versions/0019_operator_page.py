"""The operator page (``/ops``): its read-only role, retries linked to what they retry, the
audit of every action taken there (bulk ones run in batches from it), and the indexes its pages
read at a million predictions

- ``accounts.ops_role``: ``viewer`` signs in to ``/ops`` read-only (``is_admin`` acts).
- ``predictions.retry_of``: the prediction a retry was made from (the detail page lists the
  retries of one by it).
- ``ops_sessions``: operators' sign-ins, by a digest of the cookie (Postgres, so that the page
  lets its operator in while Redis is down).
- ``ops_actions``: who did what from ``/ops``, on which filter and how many; a bulk action's
  progress (``done``, its keyset ``cursor``) is committed with each batch, so one cut short
  resumes where it stopped and never acts twice on a prediction.
- Indexes, built in the migration's one transaction (the migrations' advisory lock is held by
  it, so none is ``CONCURRENTLY``: writes to ``predictions`` wait while they build; on a
  large table, build them ``CONCURRENTLY`` under these names beforehand and the migration
  skips them, ``IF NOT EXISTS``): every prediction
  newest first; by deployable (``target``) and by model newest first; failed ones newest first
  (the failed page, the status filter); finished ones by ``completed_at`` (the last hour's
  throughput and errors); retries by what they retry; a graph run's steps; a prediction's
  webhook deliveries; the unfinished ones by status and deployable (replacing the status-only
  index: the overview counts from the index alone); failed ones' errors by trigram (pg_trgm),
  for the error-text filter.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-20 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = [
    ("ix_predictions_created", "(created_at, id)", None),
    ("ix_predictions_target_created", "(target, created_at, id)", None),
    ("ix_predictions_model_created", "(model, created_at, id)", None),
    ("ix_predictions_failed_created", "(created_at, id)", "status = 'failed'"),
    ("ix_predictions_completed", "(completed_at)", "completed_at IS NOT NULL"),
    ("ix_predictions_retry_of", "(retry_of)", "retry_of IS NOT NULL"),
    ("ix_predictions_graph_run", "((graph ->> 'id'))", "graph IS NOT NULL"),
    (
        "ix_predictions_unfinished_target",
        "(status, target)",
        "status IN ('starting', 'processing')",
    ),
]


def upgrade() -> None:
    op.add_column("accounts", sa.Column("ops_role", sa.String(16), nullable=True))
    op.add_column("predictions", sa.Column("retry_of", sa.String(32), nullable=True))
    op.create_table(
        "ops_actions",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column(
            "account_id",
            sa.BigInteger,
            sa.ForeignKey("accounts.id", name="fk_ops_actions_account_id_accounts"),
            nullable=False,
        ),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("subject", sa.Text, nullable=True),
        sa.Column("filter", JSONB, nullable=True),
        sa.Column("expected", sa.Integer, nullable=False, server_default="0"),
        sa.Column("done", sa.Integer, nullable=False, server_default="0"),
        sa.Column("cursor", JSONB, nullable=True),
        sa.Column("status", sa.String(16), nullable=False, server_default="done"),
        sa.Column("detail", sa.Text, nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_ops_actions"),
    )
    op.create_index("ix_ops_actions_created", "ops_actions", ["created_at"])
    op.create_table(
        "ops_sessions",
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column(
            "account_id",
            sa.BigInteger,
            sa.ForeignKey(
                "accounts.id", name="fk_ops_sessions_account_id_accounts", ondelete="CASCADE"
            ),
            nullable=False,
        ),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("digest", name="pk_ops_sessions"),
    )
    op.create_index("ix_ops_sessions_expires_at", "ops_sessions", ["expires_at"])
    op.create_index(
        "ix_ops_actions_running",
        "ops_actions",
        ["id"],
        postgresql_where=sa.text("status = 'running'"),
    )
    for name, columns, where in INDEXES:
        clause = f" WHERE {where}" if where else ""
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON predictions {columns}{clause}")
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_webhook_deliveries_prediction_id "
        "ON webhook_deliveries (prediction_id)"
    )
    # The unfinished index with the target beside the status: the overview counts per
    # deployable from the index alone. It replaces the status-only one (same entries).
    op.execute("DROP INDEX IF EXISTS ix_predictions_unfinished")
    _error_search_index()


def _error_search_index() -> None:
    """Trigram index of failed predictions' errors, for the error-text filter (``ILIKE``).
    pg_trgm ships with PostgreSQL and is a trusted extension (a database owner may create it);
    where it cannot be created the filter still works, by scanning failed predictions."""
    bind = op.get_bind()
    savepoint = bind.begin_nested()  # a refusal must not end the migration's transaction
    try:
        bind.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except Exception as error:  # any refusal: go on without the index
        savepoint.rollback()
        print(f"pg_trgm not available ({error}); error-text search scans failed predictions")
        return
    savepoint.commit()
    bind.exec_driver_sql(
        "CREATE INDEX IF NOT EXISTS ix_predictions_failed_error "
        "ON predictions USING gin (error gin_trgm_ops) WHERE status = 'failed'"
    )


def downgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_predictions_unfinished ON predictions "
        "(status) WHERE status IN ('starting', 'processing')"
    )
    op.execute("DROP INDEX IF EXISTS ix_predictions_failed_error")
    op.execute("DROP INDEX IF EXISTS ix_webhook_deliveries_prediction_id")
    for name, _, _ in INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
    op.drop_table("ops_sessions")
    op.drop_table("ops_actions")
    op.drop_column("predictions", "retry_of")
    op.drop_column("accounts", "ops_role")
