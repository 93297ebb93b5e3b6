"""Blocks: a deployment, or a model version, published under an id that the inference gateway
runs, with free metadata that search filters on. An id is ``blk-`` and eight lowercase
letters or digits when drawn, 4 to 12 when an operator chooses it (ids clients already name
may be shorter, e.g. the seed's ``blk-xhhwhwu``).

A block belongs to the owner of what it names (the deployment's owner; a version block's, the
model's owner), whoever publishes it: over REST, an admin's ``conduit admin create-block``, or
an admin account's ``POST /v1/blocks`` (:func:`create` decides it, for all of them). Whoever
manages that owner's things may delete it (its owner, an admin account). Who may *use*
it is who may use what it names, by the catalog's own rules (:func:`catalog.lookups.sees`
and the account's grants): a deployment block is usable as its deployment is, a version block
as its model is. :func:`resolve` answers only usable blocks, and answers every other one
exactly as one that does not exist.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, Select, Table, and_, delete, func, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import lookups, records
from catalog.records import AccountInfo, Grants
from tracker.block_tables import Block
from tracker.db import autocommit
from tracker.keyset import PageKey, keyset_page
from tracker.tables import Account, Deployment, Grant, Model, Version

blocks = cast(Table, Block.__table__)

BLOCK_ID = re.compile(r"blk-[a-z0-9]{4,12}")
_ALPHABET = string.ascii_lowercase + string.digits

#: Where the grants of an account come from: the catalog's query by default; a process
#: that caches grants (the api's catalog) passes its cache, so a block is usable exactly
#: when the deployment or model it names is, there.
GrantsLoader = Callable[[int], Awaitable[Grants]]


class BlockIdTaken(ValueError):
    """The chosen block id names a block already."""


def new_block_id() -> str:
    return "blk-" + "".join(secrets.choice(_ALPHABET) for _ in range(8))


@dataclass(frozen=True, slots=True)
class BlockInfo:
    id: str
    account_id: int
    #: The publishing account's name.
    owner: str
    #: Set for a deployment block (with ``deployment``, its ``owner/name``) ...
    deployment_id: int | None
    deployment: str | None
    #: ... or for a version block: exactly one of the two.
    version_id: str | None
    #: The model (``owner/name``) of the deployment or version.
    model: str
    metadata: dict[str, Any]
    synchronous: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class _Subject:
    """What a block names, as the catalog's visibility rules read it."""

    kind: records.Kind
    id: int
    owner: str
    visibility: str


_COLUMNS = (
    Block.id,
    Block.account_id,
    Account.name,
    Block.deployment_id,
    Deployment.owner,
    Deployment.name,
    Block.version_id,
    Model.owner,
    Model.name,
    Block.metadata_,
    Block.synchronous,
    Block.created_at,
    Deployment.visibility,
    Model.id,
    Model.visibility,
)


def _query() -> Select[Any]:
    return (
        select(*_COLUMNS)
        .select_from(Block)
        .join(Account, Account.id == Block.account_id)
        .outerjoin(Deployment, Deployment.id == Block.deployment_id)
        .outerjoin(Version, Version.id == Block.version_id)
        .join(Model, Model.id == func.coalesce(Deployment.model_id, Version.model_id))
    )


def _block(row: Any) -> BlockInfo:
    deployment = f"{row[4]}/{row[5]}" if row[3] is not None else None
    return BlockInfo(
        id=row[0],
        account_id=row[1],
        owner=row[2],
        deployment_id=row[3],
        deployment=deployment,
        version_id=row[6],
        model=f"{row[7]}/{row[8]}",
        metadata=row[9],
        synchronous=row[10],
        created_at=row[11],
    )


def _subject(row: Any) -> _Subject:
    if row[3] is not None:
        return _Subject("deployment", row[3], row[4], row[12])
    return _Subject("model", row[13], row[7], row[14])


async def _row(engine: AsyncEngine, block_id: str) -> Any:
    if not BLOCK_ID.fullmatch(block_id):
        return None
    async with autocommit(engine).connect() as conn:
        return (await conn.execute(_query().where(Block.id == block_id))).one_or_none()


def _owner_id(deployment_id: int | None, version_id: str | None) -> Any:
    """The account a block of this deployment (or version) belongs to: the deployment's owner
    (the version's model's owner), as a scalar subquery."""
    if deployment_id is not None:
        owner = select(Deployment.owner).where(Deployment.id == deployment_id)
    else:
        owner = (
            select(Model.owner)
            .join(Version, Version.model_id == Model.id)
            .where(Version.id == version_id)
        )
    return select(Account.id).where(Account.name == owner.scalar_subquery()).scalar_subquery()


async def create(
    engine: AsyncEngine,
    *,
    deployment_id: int | None = None,
    version_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    synchronous: bool = False,
    block_id: str | None = None,
) -> BlockInfo:
    """Publish a deployment (``deployment_id``) or a version (``version_id``), not both, as a
    block of the deployment's owner (the model's owner: the one rule, whoever publishes it).
    Whether the caller may publish it is the caller's to decide. ``block_id`` chooses the id
    (an operator recreating a block its clients name); taken already, :class:`BlockIdTaken`;
    a deployment or version that does not exist, :class:`LookupError`."""
    if (deployment_id is None) == (version_id is None):
        raise ValueError("a block names a deployment or a version, exactly one")
    if block_id is not None and not BLOCK_ID.fullmatch(block_id):
        raise ValueError(f"a block id is blk- and 4 to 12 letters or digits: {block_id!r}")
    async with autocommit(engine).connect() as conn:
        owner_id = (await conn.execute(select(_owner_id(deployment_id, version_id)))).scalar()
    if owner_id is None:
        raise LookupError(f"no deployment {deployment_id} or version {version_id} to publish")
    values = {
        "account_id": owner_id,
        "deployment_id": deployment_id,
        "version_id": version_id,
        "metadata": metadata or {},
        "synchronous": synchronous,
    }
    async with autocommit(engine).connect() as conn:
        while True:  # a new id that collides with one in use is drawn again
            inserted = await conn.execute(
                pg_insert(blocks)
                .values(id=block_id or new_block_id(), **values)
                .on_conflict_do_nothing(index_elements=[blocks.c.id])
                .returning(blocks.c.id)
            )
            created = inserted.scalar_one_or_none()
            if created is not None:
                break
            if block_id is not None:
                raise BlockIdTaken(block_id)
    found = await get(engine, created)
    assert found is not None
    return found


async def get(engine: AsyncEngine, block_id: str) -> BlockInfo | None:
    """The block, whoever may use it (the operator's view)."""
    row = await _row(engine, block_id)
    return _block(row) if row is not None else None


async def _may_use(
    engine: AsyncEngine, account: AccountInfo, subject: _Subject, grants: GrantsLoader | None
) -> bool:
    if records.sees(account, subject.owner, subject.visibility, granted=False):
        return True  # public or its own: no grants to read
    load = grants or (lambda account_id: lookups.grants_of(engine, account_id))
    granted = await load(account.id)
    return subject.id in (granted.deployments if subject.kind == "deployment" else granted.models)


async def resolve(
    engine: AsyncEngine,
    account: AccountInfo,
    block_id: str,
    grants: GrantsLoader | None = None,
) -> BlockInfo | None:
    """The block, if ``account`` may use (run) it; else None, as for one that does not
    exist, so a private block's id is no oracle."""
    row = await _row(engine, block_id)
    if row is None:
        return None
    return _block(row) if await _may_use(engine, account, _subject(row), grants) else None


async def find(
    engine: AsyncEngine,
    account: AccountInfo,
    block_id: str,
    grants: GrantsLoader | None = None,
) -> BlockInfo | None:
    """The block, if ``account`` published it or may use it; else None."""
    row = await _row(engine, block_id)
    if row is None:
        return None
    if row[1] == account.id or await _may_use(engine, account, _subject(row), grants):
        return _block(row)
    return None


def _listed_for(account: AccountInfo) -> ColumnElement[bool]:
    """The account's own blocks and those it may use (SQL, by the catalog's rules)."""
    # The catalog's own condition for what an account sees (one rule, in one place),
    # applied to what each kind of block names.
    visible = lookups._visible_to
    return or_(
        Block.account_id == account.id,
        and_(
            Block.deployment_id.is_not(None),
            visible(account, Deployment, Grant.deployment_id),
        ),
        and_(Block.version_id.is_not(None), visible(account, Model, Grant.model_id)),
    )


async def list_blocks(
    engine: AsyncEngine,
    account: AccountInfo | None,
    *,
    after: PageKey | None = None,
    before: PageKey | None = None,
    limit: int = 100,
) -> list[BlockInfo]:
    """Newest first: those ``account`` published or may use (every block when None).
    ``after`` pages towards older rows, ``before`` towards newer ones."""
    query = _query()
    if account is not None:
        query = query.where(_listed_for(account))
    query = keyset_page(query, blocks.c.created_at, blocks.c.id, after=after, before=before)
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(query.limit(limit))).all()
    found = [_block(row) for row in rows]
    return found[::-1] if before is not None else found


async def delete_block(engine: AsyncEngine, block_id: str, account_id: int | None = None) -> bool:
    """Delete the block (only if it belongs to ``account_id``, when given); False when there
    was no such block."""
    if not BLOCK_ID.fullmatch(block_id):
        return False
    statement = delete(Block).where(Block.id == block_id)
    if account_id is not None:
        statement = statement.where(Block.account_id == account_id)
    async with autocommit(engine).connect() as conn:
        deleted = await conn.execute(statement.returning(Block.id))
        return deleted.first() is not None


async def published(engine: AsyncEngine) -> list[tuple[str, dict[str, Any], bool]]:
    """Every block as a cluster publishes it in the registry: its id, its metadata, and
    whether any account may use it (what it names is public)."""
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(_query().order_by(Block.id))).all()
    return [(row[0], row[9], _subject(row).visibility == "public") for row in rows]
