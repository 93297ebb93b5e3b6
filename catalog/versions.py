"""Versions registered, trained and deleted, by any principal (:mod:`catalog.rules`).

A version is what a runner serves: registering one (``conduit admin create-model``) makes its
model when missing, by the model rules of :mod:`catalog.models`; a training makes one for its
destination model. A version is deleted only while none of its owner's deployments pins it
and nothing of it is queued or running, and never once another account has run it; another
account's deployment never holds it (it is withdrawn with it,
:func:`catalog.lookups.deployment_withdrawn`). Deletes are soft (``deleted_at``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from sqlalchemy import exists, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.models import registered_model
from catalog.records import AccountInfo, ModelInfo, Visibility, manages
from catalog.rows import account_id, count, lock, require_owner
from catalog.rules import InUse, NotOwner
from tracker.block_tables import Block
from tracker.keys import DEFAULT_SHARDS
from tracker.states import UNFINISHED
from tracker.tables import Deployment, Model, Prediction, Version


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


async def register_version(
    engine: AsyncEngine,
    principal: AccountInfo,
    owner: str,
    name: str,
    openapi_schema: dict[str, Any],
    cog_version: str | None,
    shards: int = DEFAULT_SHARDS,
    visibility: Visibility | None = None,
    *,
    create_owner: bool = False,
) -> str:
    """Make the model if needed (:func:`catalog.models.registered_model`) and a version for
    this schema; make it the latest. ``create_owner``: make a missing owner account (an admin
    principal only)."""
    version_id = version_id_for(owner, name, openapi_schema, cog_version)
    async with engine.begin() as conn:
        await require_owner(conn, principal, owner, create=create_owner)
        model_id = await registered_model(conn, principal, owner, name, visibility)
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


async def delete_version(
    engine: AsyncEngine, model: ModelInfo, version_id: str, principal: AccountInfo
) -> None:
    if not manages(principal, model.owner):
        raise NotOwner(f"Versions of {model.owner}/{model.name} are deleted by {model.owner}")
    async with engine.begin() as conn:
        if not await lock(conn, Version.id, version_id, Version.deleted_at.is_(None)):
            raise LookupError(f"Version {version_id} does not exist")
        # Only the owner's own deployments hold a version: another account's deployment of it
        # is withdrawn with it (``catalog.lookups.deployment_withdrawn``).
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
        blocks = await count(conn, Block, Block.version_id == version_id)
        if blocks:
            raise InUse(f"Version {version_id} is published as {blocks} block(s)")
        running = await count(
            conn, Prediction, Prediction.version_id == version_id, Prediction.status.in_(UNFINISHED)
        )
        if running:
            raise InUse(f"Version {version_id} has {running} prediction(s) queued or running")
        owner_id = await account_id(conn, model.owner)
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
