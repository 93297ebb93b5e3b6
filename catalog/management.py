"""Models, versions and deployments changed by their owners over the API (``api.routes.manage``).

The rules are Replicate's: an account manages what its own name owns (an admin account,
every account's); a model is deleted only once it has no versions and none of its owner's
deployments runs it; a version only while none of the owner's deployments pins it and nothing
of it is queued or running, and never once another account has run it. Another account's
deployment never holds a model or version: the model's owner's withdrawal wins, and such a
deployment is withdrawn with it (:func:`catalog.lookups.deployment_withdrawn`), as is one of a
model its owner made private. A deployment is deleted only while nothing of it is queued or
running.
Versions and models are deleted softly (``deleted_at``), so predictions keep the version they
name and their usage records stay. Each change runs in one transaction that locks the row it
changes, so two concurrent calls cannot both pass a check the other invalidates.

Whether the caller may *see* the thing at all is the route's question (it answers 404, as for a
name that does not exist); this module raises :class:`NotOwner` for one it may see but not
change, :class:`InUse` for a delete that must wait, :class:`Refused` for a value at fault and
:class:`LookupError` for a name that is gone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.lookups import AccountInfo, DeploymentInfo, ModelInfo, Visibility, manages
from catalog.lookups import get_deployment as read_deployment
from catalog.lookups import get_model as read_model
from tracker.block_tables import Block
from tracker.keys import DEFAULT_SHARDS
from tracker.states import UNFINISHED
from tracker.tables import Account, Deployment, Model, Prediction, Version

#: A new model's or deployment's name: it becomes part of Redis keys and URLs.
NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,98}[a-z0-9])?")
#: What a model's PATCH may change.
MODEL_FIELDS = frozenset(
    {"description", "visibility", "hardware", "github_url", "paper_url", "license_url"}
    | {"cover_image_url"}
)
#: Directors the Kubernetes kit may run for one deployment.
MAX_INSTANCES = 1000


@dataclass
class Refused(Exception):
    """A value at fault (422), naming its field."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InUse(Exception):
    """A delete (or change) that must wait for something still using it (409)."""


class NotOwner(Exception):
    """Seen but not the caller's to change (403)."""


@dataclass(frozen=True)
class DeploymentChanges:
    """What a deployment's create or PATCH sets; None leaves a field as it is."""

    version: str | None = None
    hardware: str | None = None
    min_instances: int | None = None
    max_instances: int | None = None


def check_name(field_name: str, name: str) -> None:
    if not NAME.fullmatch(name):
        raise Refused(
            field_name,
            "must be 1-100 lowercase letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit",
        )


def check_hardware(hardware: str, known: set[str]) -> None:
    """``hardware`` must be a class the fleet has (``GET /v1/hardware``)."""
    if hardware in known:
        return
    have = ", ".join(sorted(known)) if known else "none yet: start a runner first"
    raise Refused("hardware", f"{hardware!r} is not a hardware class of the fleet ({have})")


def check_instances(low: int, high: int) -> None:
    if low < 0:
        raise Refused("min_instances", "must be 0 or more")
    if high < 1 or high > MAX_INSTANCES:
        raise Refused("max_instances", f"must be between 1 and {MAX_INSTANCES}")
    if low > high:
        raise Refused("min_instances", f"must not exceed max_instances ({high})")


async def create_model(
    engine: AsyncEngine, account: AccountInfo, owner: str, name: str, values: dict[str, Any]
) -> ModelInfo:
    """A new model (no versions yet: a runner registers them). ``values``: visibility,
    hardware, description and links, already checked."""
    if not manages(account, owner):
        raise NotOwner(f"Models owned by {owner} can only be created by {owner}")
    check_name("name", name)
    async with engine.begin() as conn:
        if await _account_id(conn, owner) is None:
            raise Refused("owner", f"there is no account {owner}")
        inserted = await conn.execute(
            pg_insert(Model)
            .values(owner=owner, name=name, **values)
            .on_conflict_do_nothing(
                index_elements=[Model.owner, Model.name], index_where=Model.deleted_at.is_(None)
            )
            .returning(Model.id)
        )
        if inserted.one_or_none() is None:
            raise InUse(f"A model named {owner}/{name} already exists")
    model = await read_model(engine, owner, name)
    assert model is not None
    return model


async def update_model(
    engine: AsyncEngine, model: ModelInfo, account: AccountInfo, values: dict[str, Any]
) -> ModelInfo:
    if not manages(account, model.owner):
        raise NotOwner(f"{model.owner}/{model.name} can only be changed by {model.owner}")
    if values:
        async with engine.begin() as conn:
            await conn.execute(update(Model).where(Model.id == model.id).values(**values))
    found = await read_model(engine, model.owner, model.name)
    if found is None:
        raise LookupError(f"Model {model.owner}/{model.name} does not exist")
    return found


async def delete_model(engine: AsyncEngine, model: ModelInfo, account: AccountInfo) -> None:
    if not manages(account, model.owner):
        raise NotOwner(f"{model.owner}/{model.name} can only be deleted by {model.owner}")
    async with engine.begin() as conn:
        if not await _lock(conn, Model.id, model.id, Model.deleted_at.is_(None)):
            raise LookupError(f"Model {model.owner}/{model.name} does not exist")
        versions = await _count(
            conn, Version, Version.model_id == model.id, Version.deleted_at.is_(None)
        )
        if versions:
            raise InUse(f"{model.owner}/{model.name} has {versions} version(s): delete them first")
        deployments = await _count(
            conn, Deployment, Deployment.model_id == model.id, Deployment.owner == model.owner
        )
        if deployments:
            raise InUse(
                f"{model.owner}/{model.name} is run by {deployments} deployment(s): "
                "delete them first"
            )
        await conn.execute(update(Model).where(Model.id == model.id).values(deleted_at=func.now()))


async def delete_version(
    engine: AsyncEngine, model: ModelInfo, version_id: str, account: AccountInfo
) -> None:
    if not manages(account, model.owner):
        raise NotOwner(f"Versions of {model.owner}/{model.name} are deleted by {model.owner}")
    async with engine.begin() as conn:
        if not await _lock(conn, Version.id, version_id, Version.deleted_at.is_(None)):
            raise LookupError(f"Version {version_id} does not exist")
        # Only the owner's own deployments hold a version: another account's deployment of it
        # is withdrawn with it (``catalog.deployment_withdrawn``).
        pinned = (
            await conn.execute(
                select(Deployment.owner, Deployment.name).where(
                    Deployment.version_id == version_id, Deployment.owner == model.owner
                )
            )
        ).all()
        if pinned:
            names = ", ".join(f"{o}/{n}" for o, n in pinned)
            raise InUse(f"Version {version_id} is run by deployment {names}: change it first")
        blocks = await _count(conn, Block, Block.version_id == version_id)
        if blocks:
            raise InUse(f"Version {version_id} is published as {blocks} block(s)")
        running = await _count(
            conn, Prediction, Prediction.version_id == version_id, Prediction.status.in_(UNFINISHED)
        )
        if running:
            raise InUse(f"Version {version_id} has {running} prediction(s) queued or running")
        owner_id = await _account_id(conn, model.owner)
        others = await conn.execute(
            select(
                exists().where(
                    Prediction.version_id == version_id, Prediction.account_id != owner_id
                )
            )
        )
        if others.scalar():
            raise InUse(f"Version {version_id} has been run by other accounts: it is kept")
        await conn.execute(
            update(Version).where(Version.id == version_id).values(deleted_at=func.now())
        )
        latest = (
            select(Version.id)
            .where(Version.model_id == model.id, Version.deleted_at.is_(None))
            .order_by(Version.created_at.desc())
            .limit(1)
            .scalar_subquery()
        )
        await conn.execute(
            update(Model)
            .where(Model.id == model.id, Model.latest_version_id == version_id)
            .values(latest_version_id=latest)
        )


async def create_deployment(
    engine: AsyncEngine,
    account: AccountInfo,
    owner: str,
    name: str,
    model: ModelInfo,
    changes: DeploymentChanges,
) -> DeploymentInfo:
    """A new deployment of ``model`` owned by ``owner`` (the caller, or an admin's choice),
    private; ``changes`` carries every field."""
    if not manages(account, owner):
        raise NotOwner(f"Deployments owned by {owner} can only be created by {owner}")
    check_name("name", name)
    assert changes.version is not None and changes.hardware is not None
    low, high = changes.min_instances or 0, changes.max_instances or 1
    check_instances(low, high)
    async with engine.begin() as conn:
        await _check_version(conn, model.id, f"{model.owner}/{model.name}", changes.version)
        try:
            inserted = await conn.execute(
                pg_insert(Deployment)
                .values(
                    owner=owner,
                    name=name,
                    model_id=model.id,
                    version_id=changes.version,
                    visibility=Visibility.PRIVATE.value,
                    shards=DEFAULT_SHARDS,
                    hardware=changes.hardware,
                    min_instances=low,
                    max_instances=high,
                    released_by=account.name,
                )
                .on_conflict_do_nothing(constraint="uq_deployments_owner_name")
                .returning(Deployment.id)
            )
        except IntegrityError as error:  # the owner account does not exist
            raise Refused("owner", f"there is no account {owner}") from error
        if inserted.one_or_none() is None:
            raise InUse(f"A deployment named {owner}/{name} already exists")
    return await _read(engine, owner, name)


async def update_deployment(
    engine: AsyncEngine,
    deployment: DeploymentInfo,
    account: AccountInfo,
    changes: DeploymentChanges,
) -> DeploymentInfo:
    """A new release: the fields given change, the release number goes up by one (a PATCH
    that changes nothing makes no release). A new version takes over the deployment's queue:
    directors of the old version stop reading it and those of the new one drain it
    (``director.release_watch``)."""
    if not manages(account, deployment.owner):
        raise NotOwner(f"{deployment.full_name} can only be changed by {deployment.owner}")
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                select(
                    Deployment.model_id,
                    Deployment.version_id,
                    Deployment.hardware,
                    Deployment.min_instances,
                    Deployment.max_instances,
                )
                .where(Deployment.id == deployment.id)
                .with_for_update()
            )
        ).one_or_none()
        if row is None:
            raise LookupError(f"Deployment {deployment.full_name} does not exist")
        current = {
            "version_id": row.version_id,
            "hardware": row.hardware,
            "min_instances": row.min_instances,
            "max_instances": row.max_instances,
        }
        wanted = dict(current)
        for key, value in (
            ("version_id", changes.version),
            ("hardware", changes.hardware),
            ("min_instances", changes.min_instances),
            ("max_instances", changes.max_instances),
        ):
            if value is not None:
                wanted[key] = value
        check_instances(int(wanted["min_instances"]), int(wanted["max_instances"]))
        if wanted["version_id"] != current["version_id"]:
            await _check_version(
                conn, int(row.model_id), deployment.model, str(wanted["version_id"])
            )
        if wanted != current:
            await conn.execute(
                update(Deployment)
                .where(Deployment.id == deployment.id)
                .values(
                    **wanted,
                    release_number=Deployment.release_number + 1,
                    released_by=account.name,
                    released_at=func.now(),
                )
            )
    return await _read(engine, deployment.owner, deployment.name)


async def delete_deployment(
    engine: AsyncEngine, deployment: DeploymentInfo, account: AccountInfo
) -> None:
    """Gone once nothing of it is queued or running; its finished predictions keep its name
    (``predictions.deployment``) but no longer its row."""
    if not manages(account, deployment.owner):
        raise NotOwner(f"{deployment.full_name} can only be deleted by {deployment.owner}")
    async with engine.begin() as conn:
        if not await _lock(conn, Deployment.id, deployment.id):
            raise LookupError(f"Deployment {deployment.full_name} does not exist")
        blocks = await _count(conn, Block, Block.deployment_id == deployment.id)
        if blocks:
            raise InUse(f"{deployment.full_name} is published as {blocks} block(s)")
        running = await _count(
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
    found = await read_deployment(engine, owner, name)
    if found is None:
        raise LookupError(f"Deployment {owner}/{name} does not exist")
    return found


async def _check_version(conn: AsyncConnection, model_id: int, model: str, version_id: str) -> None:
    found = await conn.execute(
        select(Version.id).where(
            Version.id == version_id, Version.model_id == model_id, Version.deleted_at.is_(None)
        )
    )
    if found.one_or_none() is None:
        raise Refused("version", f"{model} has no version {version_id}")


async def _lock(conn: AsyncConnection, column: Any, key: object, *where: Any) -> bool:
    """Lock the row whose ``column`` is ``key`` (and ``where``); False when there is none."""
    found = await conn.execute(select(column).where(column == key, *where).with_for_update())
    return found.one_or_none() is not None


async def _count(conn: AsyncConnection, table: Any, *where: Any) -> int:
    found = await conn.execute(select(func.count()).select_from(table).where(*where))
    return int(found.scalar_one())


async def _account_id(conn: AsyncConnection, name: str) -> int | None:
    found = await conn.execute(select(Account.id).where(Account.name == name))
    value = found.scalar_one_or_none()
    return int(value) if value is not None else None
