"""The registry's tables (:mod:`blocks.inference_servers`): inference servers and the blocks each
cluster's gateway publishes. On :data:`tracker.tables.Base`'s metadata like every table."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, Float, ForeignKey, Index, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from tracker.tables import Base, jsonb_path_index, now_column


class InferenceServer(Base):
    """An inference server of the registry (:mod:`blocks.inference_servers`): the record's own
    fields as one JSONB document, which MongoDB-style filters and updates are translated to SQL over
    (:mod:`blocks.mongo.filters`); the id and the times the server keeps in columns."""

    __tablename__ = "inference_servers"
    __table_args__ = (
        jsonb_path_index("ix_inference_servers_doc", "doc"),
        Index("ix_inference_servers_registered", "registered_at", "id"),
    )

    #: ``inference_server_id``: a uuid4, drawn by the server.
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    #: ``inference_server_name``, ``_metadata``, ``_tags`` and ``_public_url``.
    doc: Mapped[dict[str, Any]] = mapped_column(JSONB)
    registered_at: Mapped[datetime] = now_column()
    updated_at: Mapped[datetime] = now_column()
    #: The last heartbeat (None: the server never sent one), and the seconds it stays alive
    #: without the next (:mod:`blocks.inference_servers`).
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    heartbeat_grace: Mapped[float | None] = mapped_column(Float, nullable=True)


class RegistryBlock(Base):
    """A block a cluster's gateway publishes in the registry (:mod:`blocks.inference_servers`), so
    that search reaches other clusters' blocks and a block id finds the cluster that runs it."""

    __tablename__ = "registry_blocks"
    __table_args__ = (
        Index("ix_registry_blocks_block", "block_id"),
        jsonb_path_index("ix_registry_blocks_metadata", "metadata"),
    )

    server_id: Mapped[str] = mapped_column(
        String(36),
        ForeignKey("inference_servers.id", ondelete="CASCADE", name="fk_registry_blocks_server"),
        primary_key=True,
    )
    block_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    #: The block's metadata, as search's ``blockQuery`` reads it.
    block_metadata: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB)
    #: Usable by any account (a public deployment's or model's block): only these are run for
    #: another cluster's callers.
    public: Mapped[bool] = mapped_column(Boolean)
