"""The records kept beside predictions: webhook deliveries, ``Idempotency-Key`` rows, usage
records and files' records. On ``Base``'s metadata beside the domain's (``tracker.tables``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from tracker.tables import Base, now_column


class WebhookDelivery(Base):
    """A terminal (``completed``) webhook, stored with the terminal state and retried until
    delivered or given up, across restarts. ``id`` is the ``webhook-id`` on every attempt."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where="status = 'pending'",
        ),
        Index("ix_webhook_deliveries_prediction_id", "prediction_id"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    prediction_id: Mapped[str] = mapped_column(ForeignKey("predictions.id", ondelete="CASCADE"))
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    event: Mapped[str] = mapped_column(String(16))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime] = now_column()
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = now_column()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class IdempotencyKey(Base):
    """An ``Idempotency-Key`` on create: the same key and body give back the same prediction."""

    __tablename__ = "idempotency_keys"

    account_id: Mapped[int] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_sha256: Mapped[str] = mapped_column(String(64))
    prediction_id: Mapped[str] = mapped_column(ForeignKey("predictions.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = now_column()


class UsageRecord(Base):
    """What one prediction cost: written with its terminal state, in the same statement."""

    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_records_account_created", "account_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    prediction_id: Mapped[str] = mapped_column(
        ForeignKey("predictions.id", ondelete="CASCADE"), unique=True
    )
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(401))
    version_id: Mapped[str] = mapped_column(String(64))
    deployment: Mapped[str | None] = mapped_column(String(401))
    #: What the runner runs on, from its capabilities ("runner" when it does not say).
    hardware: Mapped[str] = mapped_column(String(64), server_default="runner")
    status: Mapped[str] = mapped_column(String(16))
    #: Seconds the model ran (the runner's predict_time); canceled runs count what they ran.
    predict_time: Mapped[float] = mapped_column(Float, server_default="0")
    #: Seconds on a GPU as the runner reported them (0 on a CPU runner); NULL when not said.
    gpu_time: Mapped[float | None] = mapped_column(Float)
    #: Seconds of a CPU runner's slot: predict_time on ``cpu`` hardware, else 0.
    cpu_time: Mapped[float] = mapped_column(Float, server_default="0")
    #: Seconds queued inside the runner before a slot freed; NULL when the runner did not say.
    queue_wait_time: Mapped[float | None] = mapped_column(Float)
    #: What is billed: predict_time for anything that ran, 0 for aborted predictions.
    billable_seconds: Mapped[float] = mapped_column(Float, server_default="0")
    created_at: Mapped[datetime] = now_column()


class File(Base):
    """A file's record: who owns it, what it is and when it goes. Its bytes live in the file
    store (``files``) under ``storage_key``; the row is written only once the store
    holds every byte."""

    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_account_created", "account_id", "created_at", "id"),
        Index("ix_files_expires_at", "expires_at"),
        Index("ix_files_prediction_id", "prediction_id"),
        Index("ix_files_deleted_at", "deleted_at", postgresql_where="deleted_at IS NOT NULL"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    #: ``upload`` (``POST /v1/files``) or ``output`` (a prediction's output file).
    kind: Mapped[str] = mapped_column(String(16))
    #: The prediction an output file belongs to (no foreign key: outputs may be stored while
    #: their prediction's row is being written, and outlive nothing of it).
    prediction_id: Mapped[str | None] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(255))
    content_type: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    md5: Mapped[str] = mapped_column(String(32))
    etag: Mapped[str] = mapped_column(String(128))
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, server_default="{}")
    storage_key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = now_column()
    #: When the retention sweep removes it; NULL: kept until deleted.
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Set by ``DELETE``: invisible at once; the row goes once the store let go of the bytes.
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
