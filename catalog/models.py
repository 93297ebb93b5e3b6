"""Models created, changed and deleted, by any principal (:mod:`catalog.rules`): an account
over the API (``api.routes.manage``), the operator with ``conduit admin``.

A model's name follows :data:`catalog.rules.NAME` however it is made: created empty over the
API, or by registering its first version (:func:`catalog.versions.register_version`). It is
deleted only once it has no versions and none of its owner's deployments runs it; softly
(``deleted_at``), so predictions keep the version they name and their usage records stay.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.lookups import get_model
from catalog.records import AccountInfo, ModelInfo, Visibility, manages
from catalog.rows import count, lock, require_owner
from catalog.rules import InUse, NotOwner, check_hardware, check_name
from tracker.tables import Deployment, Model, Version

#: What a model's PATCH may change.
MODEL_FIELDS = frozenset(
    {"description", "visibility", "hardware", "github_url", "paper_url", "license_url"}
    | {"cover_image_url"}
)


async def create_model(
    engine: AsyncEngine,
    principal: AccountInfo,
    owner: str,
    name: str,
    values: dict[str, Any],
    known_hardware: Collection[str] = (),
) -> ModelInfo:
    """A new model (no versions yet: a runner registers them). ``values``: visibility,
    hardware (one of ``known_hardware``, the fleet's classes), description and links."""
    if values.get("hardware") is not None:
        check_hardware(values["hardware"], known_hardware)
    if not manages(principal, owner):
        raise NotOwner(f"Models owned by {owner} can only be created by {owner}")
    check_name("name", name)
    async with engine.begin() as conn:
        await require_owner(conn, principal, owner, create=False)
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
    model = await get_model(engine, owner, name)
    assert model is not None
    return model


async def registered_model(
    conn: AsyncConnection,
    principal: AccountInfo,
    owner: str,
    name: str,
    visibility: Visibility | None,
) -> int:
    """The id of the model a version is registered under: ``owner/name``, made when missing
    (``visibility``, public unless given; an existing one keeps its own unless given)."""
    if not manages(principal, owner):
        raise NotOwner(f"Versions of {owner}/{name} are registered by {owner}")
    found = await conn.execute(
        select(Model.id).where(Model.owner == owner, Model.name == name, Model.deleted_at.is_(None))
    )
    if found.scalar_one_or_none() is None:
        check_name("name", name)
    chosen = {"visibility": Visibility(visibility).value} if visibility is not None else {}
    model_id = await conn.execute(
        pg_insert(Model)
        .values(owner=owner, name=name, **chosen)
        .on_conflict_do_update(
            index_elements=[Model.owner, Model.name],
            index_where=Model.deleted_at.is_(None),
            set_={"owner": owner, **chosen},
        )
        .returning(Model.id)
    )
    return int(model_id.scalar_one())


async def update_model(
    engine: AsyncEngine,
    model: ModelInfo,
    principal: AccountInfo,
    values: dict[str, Any],
    known_hardware: Collection[str] = (),
) -> ModelInfo:
    """Change what ``values`` names (:data:`MODEL_FIELDS`); a new ``hardware`` must be one of
    ``known_hardware``."""
    wanted = values.get("hardware")
    if wanted is not None and wanted != model.hardware:
        check_hardware(wanted, known_hardware)
    if not manages(principal, model.owner):
        raise NotOwner(f"{model.owner}/{model.name} can only be changed by {model.owner}")
    if values:
        async with engine.begin() as conn:
            await conn.execute(update(Model).where(Model.id == model.id).values(**values))
    found = await get_model(engine, model.owner, model.name)
    if found is None:
        raise LookupError(f"Model {model.owner}/{model.name} does not exist")
    return found


async def delete_model(engine: AsyncEngine, model: ModelInfo, principal: AccountInfo) -> None:
    """Once it has no versions and none of its owner's deployments runs it."""
    if not manages(principal, model.owner):
        raise NotOwner(f"{model.owner}/{model.name} can only be deleted by {model.owner}")
    async with engine.begin() as conn:
        if not await lock(conn, Model.id, model.id, Model.deleted_at.is_(None)):
            raise LookupError(f"Model {model.owner}/{model.name} does not exist")
        versions = await count(
            conn, Version, Version.model_id == model.id, Version.deleted_at.is_(None)
        )
        if versions:
            raise InUse(f"{model.owner}/{model.name} has {versions} version(s): delete them first")
        deployments = await count(
            conn, Deployment, Deployment.model_id == model.id, Deployment.owner == model.owner
        )
        if deployments:
            raise InUse(
                f"{model.owner}/{model.name} is run by {deployments} deployment(s): "
                "delete them first"
            )
        await conn.execute(update(Model).where(Model.id == model.id).values(deleted_at=func.now()))
