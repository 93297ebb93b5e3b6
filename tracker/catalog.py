"""Accounts, tokens, models, versions and deployments: lookups and creation."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import exists, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from tracker.ids import new_api_token, new_webhook_secret, token_sha256
from tracker.priority import Priority
from tracker.tables import Account, ApiToken, Deployment, Model, Version


@dataclass(frozen=True, slots=True)
class AccountInfo:
    id: int
    name: str
    active: bool
    webhook_secret: str


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


async def account_for_token(engine: AsyncEngine, token: str) -> AccountInfo | None:
    query = (
        select(Account.id, Account.name, Account.active, Account.webhook_secret)
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


async def get_model(engine: AsyncEngine, owner: str, name: str) -> ModelInfo | None:
    query = select(
        Model.id,
        Model.owner,
        Model.name,
        Model.description,
        Model.visibility,
        Model.latest_version_id,
        Model.created_at,
    ).where(Model.owner == owner, Model.name == name)
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
        select(
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
        )
        .join(Model, Model.id == Deployment.model_id)
        .where(Deployment.owner == owner, Deployment.name == name)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    if row is None:
        return None
    return DeploymentInfo(row[0], row[1], row[2], f"{row[3]}/{row[4]}", *row[5:])


async def create_account(engine: AsyncEngine, name: str) -> tuple[AccountInfo, str]:
    """Create an account (or reuse one of that name) and a new token; returns the token once."""
    token = new_api_token()
    async with engine.begin() as conn:
        statement = (
            pg_insert(Account)
            .values(name=name, webhook_secret=new_webhook_secret())
            .on_conflict_do_update(index_elements=[Account.name], set_={"name": name})
            .returning(Account.id, Account.name, Account.active, Account.webhook_secret)
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
) -> str:
    """Create the model if needed and a version for this schema; make it the latest."""
    version_id = version_id_for(owner, name, openapi_schema, cog_version)
    async with engine.begin() as conn:
        model_id = (
            await conn.execute(
                pg_insert(Model)
                .values(owner=owner, name=name)
                .on_conflict_do_update(constraint="uq_models_owner_name", set_={"owner": owner})
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
) -> DeploymentInfo:
    """Create a deployment, or release a new version/configuration of an existing one."""
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
    values = {
        "owner": owner,
        "name": name,
        "model_id": model.id,
        "version_id": version,
        "shards": shards,
        "prediction_timeout": prediction_timeout,
        "max_attempts": max_attempts,
        "priority": Priority(priority).value,
    }
    async with engine.begin() as conn:
        await conn.execute(
            pg_insert(Deployment)
            .values(values)
            .on_conflict_do_update(
                constraint="uq_deployments_owner_name",
                set_={**values, "release_number": Deployment.release_number + 1},
            )
        )
    deployment = await get_deployment(engine, owner, name)
    assert deployment is not None
    return deployment
