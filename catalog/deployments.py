"""Deployments created, released and deleted, by any principal (:mod:`catalog.rules`): the
one write path of an account over the API (``api.routes.manage``) and of the operator's
``conduit admin create-deployment`` (:func:`put_deployment`, create or release).

A new deployment's name follows :data:`catalog.rules.NAME`, its hardware is a class the fleet
has, its instances are bounded, and it runs a version of its model; it is private. A principal
creates and changes the deployments its name owns (an admin principal anyone's). A release
changes what runs (version, hardware, instances, shards, timeout, attempts, priority) and
numbers it; one that changes nothing makes no release. A deployment is deleted only while
nothing of it is queued or running. Each change runs in one transaction that locks the row it
changes, so two concurrent calls cannot both pass a check the other invalidates.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.lookups import get_deployment
from catalog.records import AccountInfo, DeploymentInfo, ModelInfo, Visibility, manages, sees
from catalog.rows import count, lock, require_owner
from catalog.rules import (
    DEFAULT_MAX_INSTANCES,
    DEFAULT_MIN_INSTANCES,
    InUse,
    NoSuchVersion,
    NotOwner,
    Refused,
    check_hardware,
    check_instances,
    check_name,
    released_by,
)
from tracker.block_tables import Block
from tracker.keys import DEFAULT_SHARDS
from tracker.priority import Priority
from tracker.states import UNFINISHED
from tracker.tables import Deployment, Model, Prediction, Version


@dataclass(frozen=True)
class DeploymentChanges:
    """What a deployment's create or release sets; None leaves a field as it is (a new
    deployment: its default)."""

    version: str | None = None
    hardware: str | None = None
    min_instances: int | None = None
    max_instances: int | None = None
    shards: int | None = None
    prediction_timeout: float | None = None
    max_attempts: int | None = None
    priority: Priority | None = None
    #: Who may run it and whether ``X-Priority: high`` is honoured: settings, not a release.
    visibility: Visibility | None = None
    allow_high_priority: bool | None = None

    def released(self) -> dict[str, Any]:
        """The release's columns it sets."""
        values = {
            "version_id": self.version,
            "hardware": self.hardware,
            "min_instances": self.min_instances,
            "max_instances": self.max_instances,
            "shards": self.shards,
            "prediction_timeout": self.prediction_timeout,
            "max_attempts": self.max_attempts,
            "priority": Priority(self.priority).value if self.priority is not None else None,
        }
        return {key: value for key, value in values.items() if value is not None}

    def settings(self) -> dict[str, Any]:
        values = {
            "visibility": Visibility(self.visibility).value if self.visibility else None,
            "allow_high_priority": self.allow_high_priority,
        }
        return {key: value for key, value in values.items() if value is not None}


#: The columns of a release, locked and compared by :func:`update_deployment`.
_RELEASED = (
    Deployment.version_id,
    Deployment.hardware,
    Deployment.min_instances,
    Deployment.max_instances,
    Deployment.shards,
    Deployment.prediction_timeout,
    Deployment.max_attempts,
    Deployment.priority,
)
_SETTINGS = (Deployment.visibility, Deployment.allow_high_priority)


async def create_deployment(
    engine: AsyncEngine,
    principal: AccountInfo,
    owner: str,
    name: str,
    model: ModelInfo,
    changes: DeploymentChanges,
    *,
    known_hardware: Collection[str] = (),
    create_owner: bool = False,
) -> DeploymentInfo:
    """A new deployment of ``model`` owned by ``owner`` (the principal, or an admin's choice),
    private unless ``changes`` says otherwise. Its version is ``changes.version`` (else the
    model's latest); its hardware, when given, one of ``known_hardware`` (the fleet's classes).
    ``create_owner``: make a missing owner account (an admin principal only)."""
    if changes.hardware is not None:
        check_hardware(changes.hardware, known_hardware)
    if not manages(principal, owner):
        raise NotOwner(f"Deployments owned by {owner} can only be created by {owner}")
    check_name("name", name)
    full_model = f"{model.owner}/{model.name}"
    version = changes.version or model.latest_version_id
    if version is None:
        raise NoSuchVersion("version", f"{full_model} has no version yet")
    low = DEFAULT_MIN_INSTANCES if changes.min_instances is None else changes.min_instances
    high = DEFAULT_MAX_INSTANCES if changes.max_instances is None else changes.max_instances
    check_instances(low, high)
    values = {
        "visibility": Visibility.PRIVATE.value,
        "shards": DEFAULT_SHARDS,
        **changes.released(),
        **changes.settings(),
        "version_id": version,
        "min_instances": low,
        "max_instances": high,
    }
    async with engine.begin() as conn:
        await require_owner(conn, principal, owner, create=create_owner)
        await _check_version(conn, principal, model.id, full_model, version)
        inserted = await conn.execute(
            pg_insert(Deployment)
            .values(
                owner=owner,
                name=name,
                model_id=model.id,
                released_by=released_by(principal),
                **values,
            )
            .on_conflict_do_nothing(constraint="uq_deployments_owner_name")
            .returning(Deployment.id)
        )
        if inserted.one_or_none() is None:
            raise InUse(f"A deployment named {owner}/{name} already exists")
    return await _read(engine, owner, name)


async def update_deployment(
    engine: AsyncEngine,
    deployment: DeploymentInfo,
    principal: AccountInfo,
    changes: DeploymentChanges,
    *,
    known_hardware: Collection[str] = (),
) -> DeploymentInfo:
    """A new release: the fields given change, the release number goes up by one (one that
    changes nothing makes no release); a new hardware must be one of ``known_hardware``. A new
    version takes over the deployment's queue: directors of the old version stop reading it
    and those of the new one drain it (``director.release_watch``)."""
    if changes.hardware is not None and changes.hardware != deployment.hardware:
        check_hardware(changes.hardware, known_hardware)
    if not manages(principal, deployment.owner):
        raise NotOwner(f"{deployment.full_name} can only be changed by {deployment.owner}")
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                select(Deployment.model_id, *_RELEASED, *_SETTINGS)
                .where(Deployment.id == deployment.id)
                .with_for_update()
            )
        ).one_or_none()
        if row is None:
            raise LookupError(f"Deployment {deployment.full_name} does not exist")
        current = {column.key: getattr(row, column.key) for column in _RELEASED}
        wanted = {**current, **changes.released()}
        check_instances(int(wanted["min_instances"]), int(wanted["max_instances"]))
        if wanted["version_id"] != current["version_id"]:
            await _check_version(
                conn, principal, int(row.model_id), deployment.model, str(wanted["version_id"])
            )
        settings = {
            key: value for key, value in changes.settings().items() if getattr(row, key) != value
        }
        release: dict[str, Any] = {}
        if wanted != current:
            release = {
                **wanted,
                "release_number": Deployment.release_number + 1,
                "released_by": released_by(principal),
                "released_at": func.now(),
            }
        if release or settings:
            await conn.execute(
                update(Deployment)
                .where(Deployment.id == deployment.id)
                .values(**release, **settings)
            )
    return await _read(engine, deployment.owner, deployment.name)


async def put_deployment(
    engine: AsyncEngine,
    principal: AccountInfo,
    owner: str,
    name: str,
    model: ModelInfo,
    changes: DeploymentChanges,
    *,
    known_hardware: Collection[str] = (),
    create_owner: bool = False,
) -> DeploymentInfo:
    """Create or update: :func:`create_deployment` when ``owner/name`` does not exist, else
    :func:`update_deployment` (a deployment's model does not change). Either way the version
    is ``changes.version``, else the model's latest."""
    existing = await get_deployment(engine, owner, name)
    if existing is None:
        return await create_deployment(
            engine,
            principal,
            owner,
            name,
            model,
            changes,
            known_hardware=known_hardware,
            create_owner=create_owner,
        )
    full_model = f"{model.owner}/{model.name}"
    if existing.model != full_model:
        raise Refused(
            "model",
            f"{existing.full_name} runs {existing.model}, not {full_model}: a deployment's "
            "model does not change (delete it and create it again)",
        )
    if changes.version is None:
        if model.latest_version_id is None:
            raise NoSuchVersion("version", f"{full_model} has no version yet")
        changes = replace(changes, version=model.latest_version_id)
    return await update_deployment(
        engine, existing, principal, changes, known_hardware=known_hardware
    )


async def delete_deployment(
    engine: AsyncEngine, deployment: DeploymentInfo, principal: AccountInfo
) -> None:
    """Gone once nothing of it is queued or running; its finished predictions keep its name
    (``predictions.deployment``) but no longer its row."""
    if not manages(principal, deployment.owner):
        raise NotOwner(f"{deployment.full_name} can only be deleted by {deployment.owner}")
    async with engine.begin() as conn:
        if not await lock(conn, Deployment.id, deployment.id):
            raise LookupError(f"Deployment {deployment.full_name} does not exist")
        blocks = await count(conn, Block, Block.deployment_id == deployment.id)
        if blocks:
            raise InUse(f"{deployment.full_name} is published as {blocks} block(s)")
        running = await count(
            conn,
            Prediction,
            Prediction.deployment_id == deployment.id,
            Prediction.status.in_(UNFINISHED),
        )
        if running:
            raise InUse(
                f"{deployment.full_name} has {running} prediction(s) queued or running: "
                "let them finish or cancel them first"
            )
        await conn.execute(
            update(Prediction)
            .where(Prediction.deployment_id == deployment.id)
            .values(deployment_id=None)
        )
        await conn.execute(delete(Deployment).where(Deployment.id == deployment.id))


async def _read(engine: AsyncEngine, owner: str, name: str) -> DeploymentInfo:
    found = await get_deployment(engine, owner, name)
    if found is None:
        raise LookupError(f"Deployment {owner}/{name} does not exist")
    return found


async def _check_version(
    conn: AsyncConnection, principal: AccountInfo, model_id: int, model: str, version_id: str
) -> None:
    """``version_id`` must be a version of ``model``. One of another model is named as such
    only to a principal that sees that model (else it is as one that does not exist)."""
    found = (
        await conn.execute(
            select(Version.model_id, Model.owner, Model.name, Model.visibility)
            .join(Model, Model.id == Version.model_id)
            .where(Version.id == version_id, Version.deleted_at.is_(None))
        )
    ).one_or_none()
    if found is not None and found.model_id == model_id:
        return
    if found is not None and sees(principal, found.owner, found.visibility, granted=False):
        raise NoSuchVersion(
            "version", f"version {version_id} belongs to {found.owner}/{found.name}, not to {model}"
        )
    raise NoSuchVersion("version", f"{model} has no version {version_id}")
