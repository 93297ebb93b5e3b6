"""Accounts, tokens, models, versions and deployments: lookups and creation.

Models and deployments belong to accounts (``owner`` is an account's name) and are ``public``
or ``private``; an account sees a private one it owns or was granted (see :func:`sees`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

import orjson
from sqlalchemy import ColumnElement, and_, delete, exists, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tracker.ids import new_api_token, new_webhook_secret, token_sha256
from tracker.priority import Priority
from tracker.tables import Account, ApiToken, Deployment, Grant, Model, Version

#: What a grant or a visibility names.
Kind = Literal["model", "deployment"]


class Visibility(StrEnum):
    PUBLIC = "public"
    PRIVATE = "private"


@dataclass(frozen=True, slots=True)
class AccountInfo:
    id: int
    name: str
    active: bool
    webhook_secret: str
    #: ``X-Priority: high`` from it is honoured (else it gets the default).
    may_use_high_priority: bool = False
    #: An operator's account (``GET /v1/fleet``).
    is_admin: bool = False


@dataclass(frozen=True, slots=True)
class Grants:
    """The private models and deployments an account was granted (by id)."""

    models: frozenset[int] = frozenset()
    deployments: frozenset[int] = frozenset()


def sees(account: AccountInfo, owner: str, visibility: str, granted: bool) -> bool:
    """Whether ``account`` may read and run a model or deployment of ``owner``: anyone a
    public one, its owner and the accounts granted it a private one. ``granted`` is only
    needed for a private one of another owner."""
    return visibility == Visibility.PUBLIC or owner == account.name or granted


@dataclass(frozen=True, slots=True)
class VersionInfo:
    id: str
    model: str  # owner/name
    openapi_schema: dict[str, Any]
    cog_version: str | None
    shards: int
    created_at: datetime
    deployed: bool  # some deployment runs it, so some director reads its streams


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: int
    owner: str
    name: str
    description: str | None
    visibility: str
    latest_version_id: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    id: int
    owner: str
    name: str
    model: str
    version_id: str
    release_number: int
    shards: int
    prediction_timeout: float
    created_at: datetime
    priority: str = Priority.NORMAL
    visibility: str = Visibility.PRIVATE
    #: ``X-Priority: high`` on it is honoured for every account that may run it.
    allow_high_priority: bool = False

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


def version_id_for(
    owner: str, name: str, openapi_schema: dict[str, Any], cog_version: str | None
) -> str:
    """A version's id: sha-256 of the model's name, its cog version and its canonical schema.

    Deterministic, so registering the same model from the same runner again gives the same id,
    and unique per model: the id keys the version's input streams (``vp-<id>``), so two models
    served by identical runners must never share one. The cog version is part of the identity
    because a version row is immutable; a runner rebuilt on another Cog is a new version.
    """
    identity = {
        "model": f"{owner}/{name}",
        "cog_version": cog_version,
        "openapi_schema": openapi_schema,
    }
    return hashlib.sha256(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)).hexdigest()


_ACCOUNT = (
    Account.id,
    Account.name,
    Account.active,
    Account.webhook_secret,
    Account.may_use_high_priority,
    Account.is_admin,
)


async def account_for_token(engine: AsyncEngine, token: str) -> AccountInfo | None:
    query = (
        select(*_ACCOUNT)
        .join(ApiToken, ApiToken.account_id == Account.id)
        .where(ApiToken.token_sha256 == token_sha256(token))
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    return AccountInfo(*row) if row is not None else None


async def get_version(engine: AsyncEngine, version_id: str) -> VersionInfo | None:
    deployed = exists().where(Deployment.version_id == Version.id)
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
        .where(Version.id == version_id)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    if row is None:
        return None
    return VersionInfo(row[0], f"{row[1]}/{row[2]}", row[3], row[4], row[5], row[6], row[7])


_MODEL = (
    Model.id,
    Model.owner,
    Model.name,
    Model.description,
    Model.visibility,
    Model.latest_version_id,
    Model.created_at,
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
)


def _deployment(row: Any) -> DeploymentInfo:
    return DeploymentInfo(row[0], row[1], row[2], f"{row[3]}/{row[4]}", *row[5:])


async def get_model(engine: AsyncEngine, owner: str, name: str) -> ModelInfo | None:
    query = select(*_MODEL).where(Model.owner == owner, Model.name == name)
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    return ModelInfo(*row) if row is not None else None


async def list_versions(engine: AsyncEngine, model_id: int) -> list[str]:
    query = (
        select(Version.id).where(Version.model_id == model_id).order_by(Version.created_at.desc())
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
    query = select(*_MODEL).where(_visible_to(account, Model, Grant.model_id))
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


async def ensure_account(conn: AsyncConnection, name: str) -> bool:
    """Make sure an account ``name`` exists (without a token); True when it was created."""
    created = await conn.execute(
        pg_insert(Account)
        .values(name=name, webhook_secret=new_webhook_secret())
        .on_conflict_do_nothing(index_elements=[Account.name])
        .returning(Account.id)
    )
    return created.one_or_none() is not None


async def get_account(engine: AsyncEngine, name: str) -> AccountInfo | None:
    async with engine.connect() as conn:
        row = (await conn.execute(select(*_ACCOUNT).where(Account.name == name))).one_or_none()
    return AccountInfo(*row) if row is not None else None


async def create_account(
    engine: AsyncEngine, name: str, admin: bool | None = None
) -> tuple[AccountInfo, str]:
    """Create an account (or reuse one of that name) and a new token; returns the token once.
    ``admin``: make it an admin (True) or not (False); None leaves a reused account as it was
    (a new one is not)."""
    token = new_api_token()
    values: dict[str, Any] = {"name": name, "webhook_secret": new_webhook_secret()}
    updated: dict[str, Any] = {"name": name}
    if admin is not None:
        values["is_admin"] = updated["is_admin"] = admin
    async with engine.begin() as conn:
        statement = (
            pg_insert(Account)
            .values(values)
            .on_conflict_do_update(index_elements=[Account.name], set_=updated)
            .returning(*_ACCOUNT)
        )
        account = AccountInfo(*(await conn.execute(statement)).one())
        await conn.execute(
            pg_insert(ApiToken).values(account_id=account.id, token_sha256=token_sha256(token))
        )
    return account, token


async def create_version(
    engine: AsyncEngine,
    owner: str,
    name: str,
    openapi_schema: dict[str, Any],
    cog_version: str | None,
    shards: int = 8,
    visibility: Visibility | None = None,
) -> str:
    """Create the model if needed and a version for this schema; make it the latest.

    The owner account is created when missing. A new model is ``visibility`` (public unless
    given); an existing one keeps its own unless ``visibility`` is given.
    """
    version_id = version_id_for(owner, name, openapi_schema, cog_version)
    chosen = {"visibility": Visibility(visibility).value} if visibility is not None else {}
    async with engine.begin() as conn:
        await ensure_account(conn, owner)
        model_id = (
            await conn.execute(
                pg_insert(Model)
                .values(owner=owner, name=name, **chosen)
                .on_conflict_do_update(
                    constraint="uq_models_owner_name", set_={"owner": owner, **chosen}
                )
                .returning(Model.id)
            )
        ).scalar_one()
        await conn.execute(
            pg_insert(Version)
            .values(
                id=version_id,
                model_id=model_id,
                openapi_schema=openapi_schema,
                cog_version=cog_version,
                shards=shards,
            )
            .on_conflict_do_nothing()
        )
        await conn.execute(
            update(Model).where(Model.id == model_id).values(latest_version_id=version_id)
        )
    return version_id


async def create_deployment(
    engine: AsyncEngine,
    owner: str,
    name: str,
    model_owner: str,
    model_name: str,
    version_id: str | None,
    shards: int,
    prediction_timeout: float,
    max_attempts: int = 1,
    priority: Priority = Priority.NORMAL,
    visibility: Visibility | None = None,
    allow_high_priority: bool | None = None,
) -> DeploymentInfo:
    """Create a deployment, or release a new version/configuration of an existing one.

    The owner account is created when missing. A new deployment is private unless
    ``visibility`` says otherwise; a new release keeps the deployment's visibility and
    priority entitlement unless they are given.
    """
    model = await get_model(engine, model_owner, model_name)
    if model is None:
        raise LookupError(f"model {model_owner}/{model_name} does not exist")
    version = version_id or model.latest_version_id
    found = await get_version(engine, version) if version is not None else None
    if found is None:
        raise LookupError(f"version {version} of {model_owner}/{model_name} does not exist")
    if found.model != f"{model_owner}/{model_name}":
        raise LookupError(
            f"version {version} belongs to {found.model}, not to {model_owner}/{model_name}"
        )
    values: dict[str, Any] = {
        "owner": owner,
        "name": name,
        "model_id": model.id,
        "version_id": version,
        "shards": shards,
        "prediction_timeout": prediction_timeout,
        "max_attempts": max_attempts,
        "priority": Priority(priority).value,
    }
    chosen: dict[str, Any] = {}
    if visibility is not None:
        chosen["visibility"] = Visibility(visibility).value
    if allow_high_priority is not None:
        chosen["allow_high_priority"] = allow_high_priority
    async with engine.begin() as conn:
        await ensure_account(conn, owner)
        await conn.execute(
            pg_insert(Deployment)
            .values({"visibility": Visibility.PRIVATE.value, **values, **chosen})
            .on_conflict_do_update(
                constraint="uq_deployments_owner_name",
                set_={**values, **chosen, "release_number": Deployment.release_number + 1},
            )
        )
    deployment = await get_deployment(engine, owner, name)
    assert deployment is not None
    return deployment


def _table(kind: Kind) -> type[Model] | type[Deployment]:
    return Model if kind == "model" else Deployment


async def _id_of(conn: AsyncConnection, kind: Kind, owner: str, name: str) -> int:
    table = _table(kind)
    found = await conn.execute(select(table.id).where(table.owner == owner, table.name == name))
    id = found.scalar_one_or_none()
    if id is None:
        raise LookupError(f"{kind} {owner}/{name} does not exist")
    return int(id)


async def _account_id(conn: AsyncConnection, name: str) -> int:
    found = await conn.execute(select(Account.id).where(Account.name == name))
    id = found.scalar_one_or_none()
    if id is None:
        raise LookupError(f"account {name} does not exist")
    return int(id)


async def set_visibility(
    engine: AsyncEngine, kind: Kind, owner: str, name: str, visibility: Visibility
) -> None:
    table = _table(kind)
    async with engine.begin() as conn:
        id = await _id_of(conn, kind, owner, name)
        await conn.execute(
            update(table).where(table.id == id).values(visibility=Visibility(visibility).value)
        )


async def grant(engine: AsyncEngine, account: str, kind: Kind, owner: str, name: str) -> bool:
    """Let ``account`` use the private model or deployment ``owner/name``; False when it
    already could by a grant."""
    column = "model_id" if kind == "model" else "deployment_id"
    async with engine.begin() as conn:
        values = {"account_id": await _account_id(conn, account)}
        values[column] = await _id_of(conn, kind, owner, name)
        inserted = await conn.execute(
            pg_insert(Grant).values(values).on_conflict_do_nothing().returning(Grant.id)
        )
        return inserted.one_or_none() is not None


async def revoke(engine: AsyncEngine, account: str, kind: Kind, owner: str, name: str) -> bool:
    """Withdraw a grant; False when there was none."""
    column = Grant.model_id if kind == "model" else Grant.deployment_id
    async with engine.begin() as conn:
        account_id = await _account_id(conn, account)
        target = await _id_of(conn, kind, owner, name)
        deleted = await conn.execute(
            delete(Grant)
            .where(Grant.account_id == account_id, column == target)
            .returning(Grant.id)
        )
        return deleted.first() is not None


async def entitle_account_priority(engine: AsyncEngine, account: str, allowed: bool) -> None:
    """Whether ``X-Priority: high`` from ``account`` is honoured."""
    async with engine.begin() as conn:
        account_id = await _account_id(conn, account)
        await conn.execute(
            update(Account).where(Account.id == account_id).values(may_use_high_priority=allowed)
        )


async def entitle_deployment_priority(
    engine: AsyncEngine, owner: str, name: str, allowed: bool
) -> None:
    """Whether ``X-Priority: high`` on deployment ``owner/name`` is honoured for anyone."""
    async with engine.begin() as conn:
        id = await _id_of(conn, "deployment", owner, name)
        await conn.execute(
            update(Deployment).where(Deployment.id == id).values(allow_high_priority=allowed)
        )


async def set_admin(engine: AsyncEngine, account: str, admin: bool) -> None:
    """Whether ``account`` is an admin (may read the fleet)."""
    async with engine.begin() as conn:
        account_id = await _account_id(conn, account)
        await conn.execute(update(Account).where(Account.id == account_id).values(is_admin=admin))
