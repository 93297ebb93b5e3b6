"""The gateway's tables: published blocks and named graphs (``blocks.blocks``,
``blocks.named_graphs``). On ``Base``'s metadata beside the domain's."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, CheckConstraint, ForeignKey, Index, String, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from tracker.tables import Base, jsonb_path_index, now_column


class Block(Base):
    """A deployment, or a model version, published as a block (``blk-…``) that the inference
    gateway runs by id. Who may use it is who may use what it names (``blocks.blocks``)."""

    __tablename__ = "blocks"
    __table_args__ = (
        CheckConstraint(
            "(deployment_id IS NULL) <> (version_id IS NULL)",
            name="ck_blocks_deployment_or_version",
        ),
        Index("ix_blocks_account_created", "account_id", "created_at", "id"),
        Index("ix_blocks_deployment_id", "deployment_id"),
        Index("ix_blocks_version_id", "version_id"),
        # What search filters on (``metadata @> …`` and JSON path queries).
        jsonb_path_index("ix_blocks_metadata", "metadata"),
    )

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    #: The account that published it: the only one that may delete it.
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    deployment_id: Mapped[int | None] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE")
    )
    version_id: Mapped[str | None] = mapped_column(ForeignKey("versions.id", ondelete="CASCADE"))
    #: Free JSON describing the block (``component.metadata.*``), what search filters on.
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, server_default="{}")
    #: Run on the synchronous lane (``/run``) rather than as a durable prediction.
    synchronous: Mapped[bool] = mapped_column(Boolean, server_default="false")
    created_at: Mapped[datetime] = now_column()


class Graph(Base):
    """A named graph of blocks (``gph-…``), registered by an account with field mappings and
    conditions (:mod:`blocks.named_graphs`); only that account reads, runs or deletes it."""

    __tablename__ = "graphs"
    __table_args__ = (
        UniqueConstraint("account_id", "name", name="uq_graphs_account_name"),
        Index("ix_graphs_account_created", "account_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    #: The spec as registered (checked then; checked again, against the blocks of the day,
    #: whenever it runs).
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = now_column()
