"""Creating and changing accounts, tokens, models, versions, deployments and grants.

The operator's writes (``conduit admin``); the api only reads the catalogue
(:mod:`catalog.lookups`). A name that does not exist is a :class:`LookupError`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.lookups import (
    ACCOUNT_COLUMNS,
    AccountInfo,
    DeploymentInfo,
    Kind,
    Visibility,
    get_deployment,
    get_model,
    get_version,
)
from core.ids import new_api_token, new_webhook_secret, token_sha256
from tracker.keys import DEFAULT_SHARDS
from tracker.priority import Priority
from tracker.tables import Account, ApiToken, Deployment, Grant, Model, Version


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


async def ensure_account(conn: AsyncConnection, name: str) -> bool:
    """Make sure an account ``name`` exists (without a token); True when it was created."""
    created = await conn.execute(
        pg_insert(Account)
        .values(name=name, webhook_secret=new_webhook_secret())
        .on_conflict_do_nothing(index_elements=[Account.name])
        .returning(Account.id)
    )
    return created.one_or_none() is not None


async def create_account(
    engine: AsyncEngine, name: str, admin: bool | None = None
) -> tuple[AccountInfo, str]:
    """Create an account (or reuse one of that name) and a new token; returns the token once.
    ``admin``: make it an admin (True) or not (False); None leaves a reused account as it was
    (a new one is not). A deactivated account of that name is active again."""
    token = new_api_token()
    values: dict[str, Any] = {"name": name, "webhook_secret": new_webhook_secret()}
    updated: dict[str, Any] = {"name": name, "active": True}
    if admin is not None:
        values["is_admin"] = updated["is_admin"] = admin
    async with engine.begin() as conn:
        statement = (
            pg_insert(Account)
            .values(values)
            .on_conflict_do_update(index_elements=[Account.name], set_=updated)
            .returning(*ACCOUNT_COLUMNS)
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
    shards: int = DEFAULT_SHARDS,
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
                    index_elements=[Model.owner, Model.name],
                    index_where=Model.deleted_at.is_(None),
                    set_={"owner": owner, **chosen},
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
            # Registered again after a delete (of it or of its model): back, under the model
            # of that name now.
            .on_conflict_do_update(
                index_elements=[Version.id],
                set_={"model_id": model_id, "deleted_at": None},
                where=Version.deleted_at.is_not(None),
            )
        )
        await conn.execute(
            update(Model).where(Model.id == model_id).values(latest_version_id=version_id)
        )
    return version_id


async def create_trained_version(
    engine: AsyncEngine, base_version_id: str, destination: str, weights_url: str, training_id: str
) -> str:
    """The version a training makes: ``destination``'s, serving the base version's model (its
    schema, Cog version and shards) with ``weights_url``; it becomes the destination's latest.

    Its id digests the destination, the base version and the training, so a training run again
    (its director died before the end was written) makes the same version, with the weights of
    the run that ended. Raises LookupError when the base version or the destination is gone.
    """
    owner, _, name = destination.partition("/")
    identity = {"model": destination, "base_version": base_version_id, "training": training_id}
    version_id = hashlib.sha256(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)).hexdigest()
    async with engine.begin() as conn:
        base = (
            await conn.execute(
                select(Version.openapi_schema, Version.cog_version, Version.shards).where(
                    Version.id == base_version_id
                )
            )
        ).one_or_none()
        model_id = (
            await conn.execute(
                select(Model.id).where(
                    Model.owner == owner, Model.name == name, Model.deleted_at.is_(None)
                )
            )
        ).scalar_one_or_none()
        if base is None or model_id is None:
            raise LookupError(f"{destination} or version {base_version_id} no longer exists")
        values = {
            "model_id": model_id,
            "weights_url": weights_url,
            "base_version_id": base_version_id,
            "training_id": training_id,
            "deleted_at": None,
        }
        await conn.execute(
            pg_insert(Version)
            .values(
                id=version_id,
                openapi_schema=base.openapi_schema,
                cog_version=base.cog_version,
                shards=base.shards,
                **values,
            )
            .on_conflict_do_update(index_elements=[Version.id], set_=values)
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


async def set_ops_role(engine: AsyncEngine, account: str, role: str | None) -> None:
    """``viewer``: ``account`` signs in to the operator page read-only; None: it does not
    (an admin always may, and acts there)."""
    async with engine.begin() as conn:
        account_id = await _account_id(conn, account)
        await conn.execute(update(Account).where(Account.id == account_id).values(ops_role=role))


async def set_admin(engine: AsyncEngine, account: str, admin: bool) -> None:
    """Whether ``account`` is an admin (may read the fleet)."""
    async with engine.begin() as conn:
        account_id = await _account_id(conn, account)
        await conn.execute(update(Account).where(Account.id == account_id).values(is_admin=admin))
