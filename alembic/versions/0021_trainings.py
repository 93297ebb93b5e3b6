"""trainings: a prediction row of kind ``training``, with the model it trains into; a version
made by a training names its base version, its weights and the training

A training is queued, fenced, delivered and streamed as a prediction is (``kind`` tells them
apart, ``destination`` names the model that gets the new version); the version it makes serves
its base version's model with ``weights_url`` (Cog's ``COG_WEIGHTS``). Columns added with
constant defaults only: no table rewrite. Live-safe.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-20 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "predictions",
        sa.Column("kind", sa.String(16), server_default="prediction", nullable=False),
    )
    op.add_column("predictions", sa.Column("destination", sa.String(201)))
    op.add_column("versions", sa.Column("base_version_id", sa.String(64)))
    op.add_column("versions", sa.Column("weights_url", sa.Text()))
    op.add_column("versions", sa.Column("training_id", sa.String(32)))


def downgrade() -> None:
    for column in ("training_id", "weights_url", "base_version_id"):
        op.drop_column("versions", column)
    op.drop_column("predictions", "destination")
    op.drop_column("predictions", "kind")
