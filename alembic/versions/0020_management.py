"""models and deployments managed over the API: a model's hardware and links, a deployment's
hardware, instance bounds and who made its current release, and when

``deployments.hardware`` names a class of the fleet registry (``GET /v1/hardware``); NULL on
rows made before this release: they run on whatever their directors' runners are, and the API
says so. ``min_instances``/``max_instances`` bound the directors the Kubernetes kit scales
(``conduit admin scaler``); the defaults are the kit's own bounds (1 and 10), so existing
deployments read as what was true of them. ``released_at`` starts as the deployment's creation.

Versions and models are deleted softly (``deleted_at``): predictions keep naming their version,
and their usage records stay. A deleted model's name is free again: the unique constraint on
(owner, name) becomes a unique index over the models not deleted.
Columns added with constant defaults only: no table rewrite. Live-safe.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-20 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MODEL_LINKS = ("github_url", "paper_url", "license_url", "cover_image_url")


def upgrade() -> None:
    op.add_column("versions", sa.Column("deleted_at", sa.DateTime(timezone=True)))
    op.add_column("models", sa.Column("deleted_at", sa.DateTime(timezone=True)))
    op.drop_constraint("uq_models_owner_name", "models")
    op.create_index(
        "uq_models_owner_name",
        "models",
        ["owner", "name"],
        unique=True,
        postgresql_where=sa.text("deleted_at IS NULL"),
    )
    op.add_column("models", sa.Column("hardware", sa.String(64)))
    for link in _MODEL_LINKS:
        op.add_column("models", sa.Column(link, sa.Text()))
    op.add_column("deployments", sa.Column("hardware", sa.String(64)))
    op.add_column(
        "deployments", sa.Column("min_instances", sa.Integer(), server_default="1", nullable=False)
    )
    op.add_column(
        "deployments", sa.Column("max_instances", sa.Integer(), server_default="10", nullable=False)
    )
    op.add_column("deployments", sa.Column("released_by", sa.String(100)))
    op.add_column(
        "deployments",
        sa.Column(
            "released_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
    )
    op.execute("UPDATE deployments SET released_at = created_at")
    op.create_check_constraint(
        "ck_deployments_instances",
        "deployments",
        "min_instances >= 0 AND max_instances >= 1 AND min_instances <= max_instances",
    )


def downgrade() -> None:
    op.drop_constraint("ck_deployments_instances", "deployments")
    for column in ("released_at", "released_by", "max_instances", "min_instances", "hardware"):
        op.drop_column("deployments", column)
    for column in (*_MODEL_LINKS, "hardware"):
        op.drop_column("models", column)
    op.execute("DELETE FROM versions WHERE deleted_at IS NOT NULL")
    op.execute("DELETE FROM models WHERE deleted_at IS NOT NULL")
    op.drop_index("uq_models_owner_name", "models")
    op.create_unique_constraint("uq_models_owner_name", "models", ["owner", "name"])
    op.drop_column("models", "deleted_at")
    op.drop_column("versions", "deleted_at")
