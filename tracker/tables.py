"""SQLAlchemy table definitions: the durable truth of Conduit. Here ``Base``, whose metadata
holds every table, and the domain's core: accounts and their tokens, the catalogue (models,
versions, deployments, grants) and predictions. What is kept beside predictions is in
``tracker.record_tables``; the gateway's, the registry's and the operator page's tables in
``block_tables``, ``registry_tables`` and ``ops_tables``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tracker.priority import Priority
from tracker.states import UNFINISHED, Status, sql_list

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def now_column() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


def jsonb_path_index(name: str, column: str) -> Index:
    """A GIN index of a JSONB column for containment (``@>``) and JSON path queries."""
    return Index(name, column, postgresql_using="gin", postgresql_ops={column: "jsonb_path_ops"})


class Account(Base):
    __tablename__ = "accounts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    active: Mapped[bool] = mapped_column(Boolean, server_default="true")
    webhook_secret: Mapped[str] = mapped_column(String(200))
    #: ``X-Priority: high`` from this account is honoured; otherwise it gets the default.
    may_use_high_priority: Mapped[bool] = mapped_column(Boolean, server_default="false")
    #: An operator's account: it may read the fleet (``GET /v1/fleet``).
    is_admin: Mapped[bool] = mapped_column(Boolean, server_default="false")
    #: ``viewer``: signs in to the operator page (``/ops``) read-only; an admin acts there too.
    ops_role: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = now_column()


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = now_column()


class Model(Base):
    __tablename__ = "models"
    __table_args__ = (
        # Over the models not deleted: a deleted one's name may be used again (migration 0020).
        Index(
            "uq_models_owner_name",
            "owner",
            "name",
            unique=True,
            postgresql_where="deleted_at IS NULL",
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    #: The owning account's name: the API shows it as is, and stream keys and directors'
    #: ``--deployment`` name it, so the database refuses to rename an account that owns any.
    owner: Mapped[str] = mapped_column(ForeignKey("accounts.name"))
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str | None] = mapped_column(Text)
    #: ``public``: every account reads and runs it; ``private``: its owner and those granted.
    visibility: Mapped[str] = mapped_column(String(20), server_default="public")
    latest_version_id: Mapped[str | None] = mapped_column(String(64))
    #: The hardware class it is meant to run on (a fleet class, ``GET /v1/hardware``).
    hardware: Mapped[str | None] = mapped_column(String(64))
    github_url: Mapped[str | None] = mapped_column(Text)
    paper_url: Mapped[str | None] = mapped_column(Text)
    license_url: Mapped[str | None] = mapped_column(Text)
    cover_image_url: Mapped[str | None] = mapped_column(Text)
    #: Deleted (``DELETE /v1/models/o/n``) at; its versions' predictions still name them.
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = now_column()


class Version(Base):
    __tablename__ = "versions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    openapi_schema: Mapped[dict[str, Any]] = mapped_column(JSONB)
    cog_version: Mapped[str | None] = mapped_column(String(100))
    shards: Mapped[int] = mapped_column(Integer, server_default="8")
    #: Deleted at: gone from the API, kept for the predictions that name it.
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Made by training ``training_id`` on ``base_version_id``: that version's model with
    #: these weights (Cog's ``COG_WEIGHTS``).
    base_version_id: Mapped[str | None] = mapped_column(String(64))
    weights_url: Mapped[str | None] = mapped_column(Text)
    training_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = now_column()


class Deployment(Base):
    __tablename__ = "deployments"
    __table_args__ = (
        UniqueConstraint("owner", "name", name="uq_deployments_owner_name"),
        CheckConstraint(
            "min_instances >= 0 AND max_instances >= 1 AND min_instances <= max_instances",
            name="ck_deployments_instances",
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    #: The owning account's name: the API shows it as is, and stream keys and directors'
    #: ``--deployment`` name it, so the database refuses to rename an account that owns any.
    owner: Mapped[str] = mapped_column(ForeignKey("accounts.name"))
    name: Mapped[str] = mapped_column(String(200))
    #: As for models. The column's default is ``public`` so that rows an earlier release
    #: writes keep working; ``conduit admin create-deployment`` makes new ones private.
    visibility: Mapped[str] = mapped_column(String(20), server_default="public")
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    version_id: Mapped[str] = mapped_column(ForeignKey("versions.id"))
    release_number: Mapped[int] = mapped_column(Integer, server_default="1")
    shards: Mapped[int] = mapped_column(Integer, server_default="8")
    prediction_timeout: Mapped[float] = mapped_column(Float, server_default="1800")
    #: Runs a prediction may start; >1 re-runs one whose director died while it was processing.
    max_attempts: Mapped[int] = mapped_column(Integer, server_default="1")
    #: ``X-Priority`` sent to the runner (high, normal, low) unless a request sets its own.
    priority: Mapped[str] = mapped_column(String(8), server_default=Priority.NORMAL.value)
    #: ``X-Priority: high`` on this deployment is honoured for every account that may run it.
    allow_high_priority: Mapped[bool] = mapped_column(Boolean, server_default="false")
    #: A fleet hardware class; NULL (rows of earlier releases): whatever its runners are.
    hardware: Mapped[str | None] = mapped_column(String(64))
    #: Bounds of the directors the Kubernetes kit scales for it (``conduit admin scaler``).
    min_instances: Mapped[int] = mapped_column(Integer, server_default="1")
    max_instances: Mapped[int] = mapped_column(Integer, server_default="10")
    #: The account that made the current release (NULL: the operator's CLI), and when.
    released_by: Mapped[str | None] = mapped_column(String(100))
    released_at: Mapped[datetime] = now_column()
    created_at: Mapped[datetime] = now_column()


class Grant(Base):
    """An account may use a private model or deployment it does not own: one row each."""

    __tablename__ = "grants"
    __table_args__ = (
        CheckConstraint(
            "(model_id IS NULL) <> (deployment_id IS NULL)", name="ck_grants_model_or_deployment"
        ),
        UniqueConstraint("account_id", "model_id", name="uq_grants_account_model"),
        UniqueConstraint("account_id", "deployment_id", name="uq_grants_account_deployment"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    deployment_id: Mapped[int | None] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE")
    )
    created_at: Mapped[datetime] = now_column()


class Prediction(Base):
    __tablename__ = "predictions"
    # Stored with fillfactor 80 (migration 0018): room on each page for a claim's new row
    # version, so that it is a HOT update and adds no index entries.
    __table_args__ = (
        Index("ix_predictions_account_created", "account_id", "created_at", "id"),
        # With the deployable and the account beside the status (migrations 0019, 0022): the
        # operator page counts unfinished predictions per deployable (and account) from the
        # index alone.
        Index(
            "ix_predictions_unfinished_account",
            "status",
            "target",
            "account_id",
            postgresql_where=f"status IN {sql_list(UNFINISHED)}",
        ),
        # Finished predictions whose data is still kept, for the retention sweep.
        Index("ix_predictions_retention", "completed_at", postgresql_where="NOT data_removed"),
        # What the operator page reads (migration 0019).
        Index("ix_predictions_created", "created_at", "id"),
        Index("ix_predictions_target_created", "target", "created_at", "id"),
        Index("ix_predictions_model_created", "model", "created_at", "id"),
        Index(
            "ix_predictions_failed_created",
            "created_at",
            "id",
            postgresql_where="status = 'failed'",
        ),
        Index(
            "ix_predictions_completed", "completed_at", postgresql_where="completed_at IS NOT NULL"
        ),
        Index("ix_predictions_retry_of", "retry_of", postgresql_where="retry_of IS NOT NULL"),
        Index(
            "ix_predictions_graph_run",
            text("(graph ->> 'id')"),
            postgresql_where="graph IS NOT NULL",
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    model: Mapped[str] = mapped_column(String(401))
    version_id: Mapped[str] = mapped_column(ForeignKey("versions.id"))
    deployment_id: Mapped[int | None] = mapped_column(ForeignKey("deployments.id"))
    deployment: Mapped[str | None] = mapped_column(String(401))
    #: ``prediction``, or ``training`` (``/v1/trainings``): queued and run alike.
    kind: Mapped[str] = mapped_column(String(16), server_default="prediction")
    #: A training's destination model (``owner/name``), which its new version goes to.
    destination: Mapped[str | None] = mapped_column(String(201))
    input: Mapped[dict[str, Any]] = mapped_column(JSONB)
    output: Mapped[Any] = mapped_column(JSONB, nullable=True)
    logs: Mapped[str] = mapped_column(Text, server_default="")
    error: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), server_default=Status.STARTING.value)
    created_at: Mapped[datetime] = now_column()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    deadline: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    webhook: Mapped[str | None] = mapped_column(Text)
    webhook_events_filter: Mapped[list[str] | None] = mapped_column(ARRAY(String(16)))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, server_default="false")
    attempt: Mapped[int] = mapped_column(Integer, server_default="0")
    #: How many attempts reached the runner (``processing``); bounded by max_attempts.
    runs: Mapped[int] = mapped_column(Integer, server_default="0")
    claim_owner: Mapped[str | None] = mapped_column(String(200))
    #: The deployable it was queued for (``dp-owner/name`` or ``vp-<version id>``, see
    #: ``tracker.keys``): its input streams are that deployable's shards.
    target: Mapped[str | None] = mapped_column(String(300))
    source: Mapped[str] = mapped_column(String(16), server_default="api")
    data_removed: Mapped[bool] = mapped_column(Boolean, server_default="false")
    #: The request's ``X-Priority``; NULL when it sent none (the deployment's applies).
    priority: Mapped[str | None] = mapped_column(String(8))
    #: The ``X-Request-Id`` of the create request (``api.request_ids``), for log lines.
    request_id: Mapped[str | None] = mapped_column(String(128))
    #: A step of a gateway graph: ``{"id": graph run, "step": block id, "head": block id}``.
    graph: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    #: The prediction this one retries (made from the operator page with the same input).
    retry_of: Mapped[str | None] = mapped_column(String(32))
