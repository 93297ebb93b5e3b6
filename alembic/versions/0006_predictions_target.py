"""predictions.target: the deployable a prediction was queued for (was predictions.stream)

Expand, then contract, so apis and directors of the earlier release keep working during a
rolling upgrade: this revision adds ``target``, fills it from ``stream``, and keeps the two
equal on every insert (a trigger copies whichever one the inserting release wrote). Nothing
updates either column after the insert. A later revision drops ``stream`` and the trigger once
no process of the earlier release runs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 01:35:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("predictions", sa.Column("target", sa.String(length=300), nullable=True))
    op.execute("UPDATE predictions SET target = stream WHERE stream IS NOT NULL")
    op.execute(
        """
        CREATE FUNCTION predictions_target_compat() RETURNS trigger AS $$
        BEGIN
          NEW.target := coalesce(NEW.target, NEW.stream);
          NEW.stream := coalesce(NEW.stream, NEW.target);
          RETURN NEW;
        END
        $$ LANGUAGE plpgsql
        """
    )
    op.execute(
        "CREATE TRIGGER predictions_target_compat BEFORE INSERT ON predictions "
        "FOR EACH ROW EXECUTE FUNCTION predictions_target_compat()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER predictions_target_compat ON predictions")
    op.execute("DROP FUNCTION predictions_target_compat()")
    op.drop_column("predictions", "target")
