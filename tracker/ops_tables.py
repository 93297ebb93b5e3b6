"""The operator page's own tables (``api.ops``): the audit of what operators did, which also
drives bulk actions, and operators' sign-ins. On ``Base``'s metadata beside the domain's."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, Integer, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from tracker.tables import Base, now_column


class OpsAction(Base):
    """What an operator did from ``/ops``: who, what, on which filter, how many. A bulk action
    runs from its row in batches; ``done`` and ``cursor`` are committed with each batch, so one
    cut short resumes where it stopped and acts on no prediction twice."""

    __tablename__ = "ops_actions"
    __table_args__ = (
        Index("ix_ops_actions_created", "created_at"),
        Index("ix_ops_actions_running", "id", postgresql_where="status = 'running'"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    #: ``retry``, ``cancel``, ``retry_all``, ``cancel_all``, ``discard_dead``, ``webhook_retry``…
    action: Mapped[str] = mapped_column(String(32))
    #: What one action acted on (a prediction id, a stream, a delivery id).
    subject: Mapped[str | None] = mapped_column(Text)
    #: A bulk action's filter, as the predictions page's query string had it.
    filter: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    #: How many the operator confirmed; ``done``: how many were acted on so far.
    expected: Mapped[int] = mapped_column(Integer, server_default="0")
    done: Mapped[int] = mapped_column(Integer, server_default="0")
    cursor: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    #: ``running`` (a bulk action under way), ``done``, ``failed``.
    status: Mapped[str] = mapped_column(String(16), server_default="done")
    detail: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = now_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class OpsSession(Base):
    """An operator's sign-in to ``/ops``, by the SHA-256 of its cookie (``api.ops.sign_ins``)."""

    __tablename__ = "ops_sessions"
    __table_args__ = (Index("ix_ops_sessions_expires_at", "expires_at"),)

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    #: ``admin`` or ``viewer``, as it was at sign-in.
    role: Mapped[str] = mapped_column(String(16))
    csrf: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = now_column()
