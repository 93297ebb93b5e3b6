"""The operator's writes (``conduit admin``, and the fixtures of tests): accounts and their
tokens, grants, visibility, priority entitlements and roles, and the operator's entries to
the one write path of versions and deployments (:func:`create_version`,
:func:`create_deployment`), which act as :data:`catalog.rules.OPERATOR` by the rules every
principal follows. A name that does not exist is a :class:`LookupError`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.deployments import DeploymentChanges, put_deployment
from catalog.lookups import get_model
from catalog.records import ACCOUNT_COLUMNS, AccountInfo, DeploymentInfo, Kind, Visibility
from catalog.rules import OPERATOR
from catalog.versions import register_version
from core.ids import new_api_token, new_webhook_secret, token_sha256
from tracker.keys import DEFAULT_SHARDS
from tracker.priority import Priority
from tracker.tables import Account, ApiToken, Deployment, Grant, Model


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
    *,
    hardware: str | None = None,
    known_hardware: Collection[str] = (),
) -> DeploymentInfo:
    """The operator's create or release of ``owner/name`` (``conduit admin
    create-deployment``): :func:`catalog.deployments.put_deployment` as :data:`OPERATOR`, by
    the rules an account's deployments follow over the API. The version is ``version_id``,
    else the model's latest; the owner account is created when missing. A new deployment is
    private unless ``visibility`` says otherwise; a release keeps the deployment's visibility
    and priority entitlement unless they are given."""
    model = await get_model(engine, model_owner, model_name)
    if model is None:
        raise LookupError(f"model {model_owner}/{model_name} does not exist")
    changes = DeploymentChanges(
        version=version_id,
        hardware=hardware,
        shards=shards,
        prediction_timeout=prediction_timeout,
        max_attempts=max_attempts,
        priority=Priority(priority),
        visibility=visibility,
        allow_high_priority=allow_high_priority,
    )
    return await put_deployment(
        engine,
        OPERATOR,
        owner,
        name,
        model,
        changes,
        known_hardware=known_hardware,
        create_owner=True,
    )


async def create_version(
    engine: AsyncEngine,
    owner: str,
    name: str,
    openapi_schema: dict[str, Any],
    cog_version: str | None,
    shards: int = DEFAULT_SHARDS,
    visibility: Visibility | None = None,
) -> str:
    """The operator's registration of a version (``conduit admin create-model``):
    :func:`catalog.versions.register_version` as :data:`OPERATOR`; the owner account is
    created when missing. A new model is ``visibility`` (public unless given); an existing one
    keeps its own unless ``visibility`` is given."""
    return await register_version(
        engine,
        OPERATOR,
        owner,
        name,
        openapi_schema,
        cog_version,
        shards,
        visibility,
        create_owner=True,
    )


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
