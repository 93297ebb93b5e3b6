"""Lookups of accounts, tokens, models, versions, deployments and grants: one by name, and
the lists an account sees (newest first, by keyset).

The records they answer, and who may see what, are :mod:`catalog.records`' (re-exported here,
where their readers have always found them); changing them is :mod:`catalog.models`',
:mod:`catalog.versions`' and :mod:`catalog.deployments`' (the operator's own entries are in
:mod:`catalog.writes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, or_, select, true
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import aliased

from catalog.records import (
    ACCOUNT_COLUMNS,
    AccountInfo,
    DeploymentInfo,
    Grants,
    ModelInfo,
    VersionInfo,
    Visibility,
)
from core.ids import token_sha256
from tracker.tables import Account, ApiToken, Deployment, Grant, Model, Version


async def account_for_token(engine: AsyncEngine, token: str) -> AccountInfo | None:
    query = (
        select(*ACCOUNT_COLUMNS)
        .join(ApiToken, ApiToken.account_id == Account.id)
        .where(ApiToken.token_sha256 == token_sha256(token))
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    return AccountInfo(*row) if row is not None else None


async def get_version(engine: AsyncEngine, version_id: str) -> VersionInfo | None:
    deployed = exists().where(Deployment.version_id == Version.id, ~deployment_withdrawn())
    query = (
        select(
            Version.id,
            Model.owner,
            Model.name,
            Version.openapi_schema,
            Version.cog_version,
            Version.shards,
            Version.created_at,
            deployed,
        )
        .join(Model, Model.id == Version.model_id)
        .where(Version.id == version_id, Version.deleted_at.is_(None))
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    if row is None:
        return None
    return VersionInfo(row[0], f"{row[1]}/{row[2]}", row[3], row[4], row[5], row[6], row[7])


def deployment_withdrawn() -> ColumnElement[bool]:
    """Whether a deployment (``Deployment``, in a query that joins its ``Model``) runs what its
    model's owner took back: a model its owner may no longer see (another account's model made
    private, or a grant revoked) or a version the model's owner deleted.

    The model's owner's withdrawal wins over another account's deployment: a withdrawn
    deployment takes no predictions (the api and the gateway answer as for a model the caller
    may not see), its directors stop reading its queue (``director.release_watch``), a version
    it runs is not ``deployed`` for it, and it never keeps the model's owner from deleting a
    version (:func:`catalog.versions.delete_version`)."""
    granted = (
        select(Grant.model_id)
        .join(Account, Account.id == Grant.account_id)
        .where(Account.name == Deployment.owner, Grant.model_id == Model.id)
        .correlate_except(Grant, Account)
        .exists()
    )
    admin = (
        select(Account.id)
        .where(Account.name == Deployment.owner, Account.is_admin)
        .correlate_except(Account)
        .exists()
    )
    hidden = and_(
        Model.visibility != Visibility.PUBLIC.value,
        Model.owner != Deployment.owner,
        ~granted,
        ~admin,  # an admin account sees every model (:func:`sees`)
    )
    released = aliased(Version)
    deleted = (
        select(released.id)
        .where(released.id == Deployment.version_id, released.deleted_at.is_not(None))
        .correlate_except(released)
        .exists()
    )
    return or_(hidden, deleted)


_MODEL = (
    Model.id,
    Model.owner,
    Model.name,
    Model.description,
    Model.visibility,
    Model.latest_version_id,
    Model.created_at,
    Model.hardware,
    Model.github_url,
    Model.paper_url,
    Model.license_url,
    Model.cover_image_url,
)

_DEPLOYMENT = (
    Deployment.id,
    Deployment.owner,
    Deployment.name,
    Model.owner,
    Model.name,
    Deployment.version_id,
    Deployment.release_number,
    Deployment.shards,
    Deployment.prediction_timeout,
    Deployment.created_at,
    Deployment.priority,
    Deployment.visibility,
    Deployment.allow_high_priority,
    Deployment.hardware,
    Deployment.min_instances,
    Deployment.max_instances,
    Deployment.released_by,
    Deployment.released_at,
    deployment_withdrawn(),
)


def _deployment(row: Any) -> DeploymentInfo:
    return DeploymentInfo(row[0], row[1], row[2], f"{row[3]}/{row[4]}", *row[5:])


async def get_model(engine: AsyncEngine, owner: str, name: str) -> ModelInfo | None:
    query = select(*_MODEL).where(
        Model.owner == owner, Model.name == name, Model.deleted_at.is_(None)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    return ModelInfo(*row) if row is not None else None


async def list_versions(engine: AsyncEngine, model_id: int) -> list[str]:
    query = (
        select(Version.id)
        .where(Version.model_id == model_id, Version.deleted_at.is_(None))
        .order_by(Version.created_at.desc())
    )
    async with engine.connect() as conn:
        return list((await conn.execute(query)).scalars())


async def get_deployment(engine: AsyncEngine, owner: str, name: str) -> DeploymentInfo | None:
    query = (
        select(*_DEPLOYMENT)
        .join(Model, Model.id == Deployment.model_id)
        .where(Deployment.owner == owner, Deployment.name == name)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    return _deployment(row) if row is not None else None


async def grants_of(engine: AsyncEngine, account_id: int) -> Grants:
    query = select(Grant.model_id, Grant.deployment_id).where(Grant.account_id == account_id)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return Grants(
        frozenset(m for m, _ in rows if m is not None),
        frozenset(d for _, d in rows if d is not None),
    )


@dataclass(frozen=True, slots=True)
class Position:
    """A keyset position in a newest-first list of models or deployments."""

    created_at: datetime
    id: int


def _visible_to(
    account: AccountInfo, table: type[Model] | type[Deployment], granted: Any
) -> ColumnElement[bool]:
    """:func:`sees`, in SQL."""
    if account.is_admin:
        return true()
    return or_(
        table.visibility == Visibility.PUBLIC.value,
        table.owner == account.name,
        table.id.in_(select(granted).where(Grant.account_id == account.id)),
    )


def _keyset(
    query: Any,
    table: type[Model] | type[Deployment],
    after: Position | None,
    before: Position | None,
) -> Any:
    """Newest first. ``after`` pages towards older rows, ``before`` towards newer ones (then
    in ascending order: the caller reverses them)."""
    created, id = table.created_at, table.id
    if after is not None:
        older = or_(created < after.created_at, and_(created == after.created_at, id < after.id))
        return query.where(older).order_by(created.desc(), id.desc())
    if before is not None:
        newer = or_(created > before.created_at, and_(created == before.created_at, id > before.id))
        return query.where(newer).order_by(created.asc(), id.asc())
    return query.order_by(created.desc(), id.desc())


async def list_models(
    engine: AsyncEngine,
    account: AccountInfo,
    *,
    after: Position | None = None,
    before: Position | None = None,
    limit: int = 100,
) -> list[ModelInfo]:
    """The models ``account`` sees, newest first."""
    query = select(*_MODEL).where(
        _visible_to(account, Model, Grant.model_id), Model.deleted_at.is_(None)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(_keyset(query, Model, after, before).limit(limit))).all()
    models = [ModelInfo(*row) for row in rows]
    return models[::-1] if before is not None else models


async def list_deployments(
    engine: AsyncEngine,
    account: AccountInfo,
    *,
    after: Position | None = None,
    before: Position | None = None,
    limit: int = 100,
) -> list[DeploymentInfo]:
    """The deployments ``account`` sees, newest first."""
    query = (
        select(*_DEPLOYMENT)
        .join(Model, Model.id == Deployment.model_id)
        .where(_visible_to(account, Deployment, Grant.deployment_id))
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(_keyset(query, Deployment, after, before).limit(limit))).all()
    deployments = [_deployment(row) for row in rows]
    return deployments[::-1] if before is not None else deployments


async def get_account(engine: AsyncEngine, name: str) -> AccountInfo | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(*ACCOUNT_COLUMNS).where(Account.name == name))
        ).one_or_none()
    return AccountInfo(*row) if row is not None else None
