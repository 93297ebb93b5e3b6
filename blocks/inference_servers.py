"""The registry of inference servers: records the seed's ``InferenceServer`` describes, kept
for search and discovery, changed with MongoDB update documents and found with MongoDB filters.

A record is ``inference_server_id`` (a uuid4 the server draws), ``inference_server_name``,
``inference_server_metadata`` (free JSON), ``inference_server_tags`` (a list of strings) and
``inference_server_public_url``, plus ``registered_at``, ``updated_at``, ``heartbeat_at`` and
``status``, which the server keeps: a server that heartbeats (:func:`heartbeat`, each beat
saying how long it stays alive without the next) is ``alive`` until that grace runs out, then
``dead`` (the record stays, marked, and is no longer routed to); one that never heartbeat is
``registered``. The four fields a client writes are one JSONB document
(``inference_servers.doc``); the id and times are columns. Filters and updates are translated to
SQL (:mod:`blocks.mongo.filters`) and evaluated by Postgres: a query never loads rows to test
them, and an update is one ``UPDATE`` of the locked row whose new document is an expression of
the old one.

An update may not make a record something other than the seed's shape: the name and URL are
strings, set whole; the tags a list of strings, set whole or changed with ``$push``,
``$addToSet`` and ``$pull``; the metadata a document, set whole or changed anywhere inside.
The server's own fields are never written by an update.

A cluster's gateway (:mod:`gateway.cluster`) also publishes its blocks (``registry_blocks``):
search (:func:`search_blocks`) filters them and the servers in one statement, and a block id
finds the live server of the cluster that runs it (:func:`block_owner`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks.mongo.common import Column, MongoError
from blocks.mongo.filters import compile_filter
from blocks.mongo.updates import Change, update_select
from tracker.db import autocommit
from tracker.render import iso

__all__ = [
    "FIELDS",
    "SERVER_FIELDS",
    "InferenceServerRecord",
    "PublishedBlock",
    "block_owner",
    "check_changes",
    "heartbeat",
    "publish_blocks",
    "search_blocks",
    "create",
    "delete",
    "get",
    "query",
    "render",
    "update",
]

#: The fields a client writes, and the kind of value each holds.
FIELDS: dict[str, type] = {
    "inference_server_name": str,
    "inference_server_metadata": dict,
    "inference_server_tags": list,
    "inference_server_public_url": str,
}
#: The fields the server keeps.
SERVER_FIELDS = ("inference_server_id", "registered_at", "updated_at", "heartbeat_at", "status")
#: A server's status, as SQL over ``inference_servers`` (aliased ``s``).
STATUS_SQL = (
    "(CASE WHEN s.heartbeat_at IS NULL THEN 'registered'"
    " WHEN s.heartbeat_at + make_interval(secs => s.heartbeat_grace) > now() THEN 'alive'"
    " ELSE 'dead' END)"
)
ALIVE_SQL = "(s.heartbeat_at + make_interval(secs => s.heartbeat_grace) > now())"
STATUSES = ("registered", "alive", "dead")


def _timestamp(value: Any) -> datetime:
    if not isinstance(value, str):
        raise TypeError("expected an ISO 8601 date and time")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError("a date and time needs its UTC offset (e.g. Z)")
    return parsed


def _server_id(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _status(value: Any) -> str:
    if value not in STATUSES:
        raise ValueError(f"a status is one of {', '.join(STATUSES)}")
    return str(value)


#: Fields filters compare in their own columns.
COLUMNS = {
    "inference_server_id": Column("s.id", _server_id),
    "registered_at": Column("s.registered_at", _timestamp),
    "updated_at": Column("s.updated_at", _timestamp),
    "heartbeat_at": Column("s.heartbeat_at", _timestamp),
    "status": Column(STATUS_SQL, _status),
}


@dataclass(frozen=True, slots=True)
class InferenceServerRecord:
    id: str
    doc: dict[str, Any]
    registered_at: datetime
    updated_at: datetime
    heartbeat_at: datetime | None = None
    status: str = "registered"

    @property
    def cluster_id(self) -> str | None:
        """The cluster whose gateway this is (``inference_server_metadata.cluster_id``)."""
        metadata = self.doc.get("inference_server_metadata")
        cluster = metadata.get("cluster_id") if isinstance(metadata, dict) else None
        return cluster if isinstance(cluster, str) else None

    @property
    def public_url(self) -> str:
        return str(self.doc.get("inference_server_public_url") or "")


def render(record: InferenceServerRecord) -> dict[str, Any]:
    return {
        "inference_server_id": record.id,
        **{name: record.doc.get(name) for name in FIELDS},
        "registered_at": iso(record.registered_at),
        "updated_at": iso(record.updated_at),
        "heartbeat_at": iso(record.heartbeat_at) if record.heartbeat_at else None,
        "status": record.status,
    }


def check_changes(changes: list[Change]) -> None:
    """Refuse changes that would leave a record of another shape (see the module)."""
    for change in changes:
        top, where, op = change.path[0], change.location, change.operator
        if top in SERVER_FIELDS:
            raise MongoError(where, f"{top} is kept by the server")
        if top not in FIELDS:
            raise MongoError(where, f"{top} is not a field of an inference server")
        whole = len(change.path) == 1
        if top == "inference_server_metadata":
            if whole and not (op == "$set" and isinstance(change.value, dict)):
                raise MongoError(where, "the metadata is a JSON object, set whole or inside")
        elif top == "inference_server_tags":
            _check_tags(change, whole)
        elif not (whole and op == "$set" and isinstance(change.value, str)):
            raise MongoError(where, f"{top} is a string, set whole with $set")


def _check_tags(change: Change, whole: bool) -> None:
    where, op = change.location, change.operator
    if not whole or op in ("$unset", "$inc"):
        raise MongoError(where, "the tags are a list: $set it whole, or $push, $addToSet, $pull")
    items = change.value if op in ("$set", "$push", "$addToSet") else []
    if not isinstance(items, list) or not all(isinstance(tag, str) for tag in items):
        raise MongoError(where, "the tags are a list of strings")


_RETURNING = f"s.id, s.doc, s.registered_at, s.updated_at, s.heartbeat_at, {STATUS_SQL} AS status"


def _record(row: Any) -> InferenceServerRecord:
    return InferenceServerRecord(
        row.id, row.doc, row.registered_at, row.updated_at, row.heartbeat_at, row.status
    )


async def create(engine: AsyncEngine, doc: dict[str, Any]) -> InferenceServerRecord:
    """Register a server: ``doc`` holds the four fields a client writes (checked)."""
    statement = text(
        "INSERT INTO inference_servers AS s (id, doc) VALUES (:id, CAST(:doc AS jsonb))"
        f" RETURNING {_RETURNING}"
    )
    async with autocommit(engine).connect() as conn:
        row = (
            await conn.execute(statement, {"id": str(uuid.uuid4()), "doc": json.dumps(doc)})
        ).one()
    return _record(row)


async def get(engine: AsyncEngine, server_id: str) -> InferenceServerRecord | None:
    statement = text(f"SELECT {_RETURNING} FROM inference_servers s WHERE s.id = :id")
    async with autocommit(engine).connect() as conn:
        row = (await conn.execute(statement, {"id": server_id})).first()
    return _record(row) if row is not None else None


async def delete(engine: AsyncEngine, server_id: str) -> bool:
    statement = text("DELETE FROM inference_servers WHERE id = :id RETURNING id")
    async with autocommit(engine).connect() as conn:
        return (await conn.execute(statement, {"id": server_id})).first() is not None


async def update(
    engine: AsyncEngine, server_id: str, changes: list[Change]
) -> InferenceServerRecord | None:
    """Apply checked changes in one statement: the row is locked (``FOR UPDATE``), its new
    document computed from the old by Postgres, and stored with a new ``updated_at`` only if
    every step applied. None: no such server; :class:`MongoError` naming the operator that
    could not apply to the stored record (nothing stored then)."""
    check_changes(changes)
    applied = update_select(changes, "cur.doc")
    statement = text(
        "WITH cur AS (SELECT id, doc FROM inference_servers WHERE id = :id FOR UPDATE),"
        f" new AS (SELECT cur.id, x.doc, x.failed FROM cur CROSS JOIN LATERAL ({applied.text}) x),"
        " upd AS (UPDATE inference_servers s SET doc = new.doc, updated_at = now() FROM new"
        f" WHERE s.id = new.id AND new.failed IS NULL RETURNING {_RETURNING})"
        " SELECT new.failed, upd.* FROM new LEFT JOIN upd ON TRUE"
    )
    async with autocommit(engine).connect() as conn:
        row = (await conn.execute(statement, {**applied.params, "id": server_id})).first()
    if row is None:
        return None
    if row.failed is not None:
        raise MongoError(
            applied.locations[row.failed], "cannot apply to the value the record holds there"
        )
    return _record(row)


async def query(
    engine: AsyncEngine, document: Any, limit: int = 100
) -> list[InferenceServerRecord]:
    """The servers a MongoDB filter matches, oldest registration first, at most ``limit``."""
    condition = compile_filter(document, "s.doc", COLUMNS)
    statement = text(
        f"SELECT {_RETURNING} FROM inference_servers s WHERE {condition.text}"
        " ORDER BY s.registered_at, s.id LIMIT :limit"
    )
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(statement, {**condition.params, "limit": limit})).all()
    return [_record(row) for row in rows]


async def heartbeat(
    engine: AsyncEngine, server_id: str, grace: float
) -> InferenceServerRecord | None:
    """The server is alive for ``grace`` seconds from now (0: dead now, as a server that stops
    says). None: no such server."""
    statement = text(
        "UPDATE inference_servers s SET heartbeat_at = now(), heartbeat_grace = :grace"
        f" WHERE s.id = :id RETURNING {_RETURNING}"
    )
    async with autocommit(engine).connect() as conn:
        row = (await conn.execute(statement, {"id": server_id, "grace": grace})).first()
    return _record(row) if row is not None else None


@dataclass(frozen=True, slots=True)
class PublishedBlock:
    block_id: str
    metadata: dict[str, Any]
    public: bool


async def publish_blocks(engine: AsyncEngine, server_id: str, blocks: list[PublishedBlock]) -> None:
    """Make ``blocks`` the server's published blocks, all at once."""
    async with engine.begin() as conn:
        await conn.execute(
            text("DELETE FROM registry_blocks WHERE server_id = :id"), {"id": server_id}
        )
        if blocks:
            await conn.execute(
                text(
                    "INSERT INTO registry_blocks (server_id, block_id, metadata, public)"
                    " VALUES (:id, :block, CAST(:metadata AS jsonb), :public)"
                ),
                [
                    {
                        "id": server_id,
                        "block": block.block_id,
                        "metadata": json.dumps(block.metadata),
                        "public": block.public,
                    }
                    for block in blocks
                ],
            )


async def block_owner(
    engine: AsyncEngine, block_id: str, exclude_cluster: str | None = None
) -> InferenceServerRecord | None:
    """The server of the cluster that publishes ``block_id`` as public, other than
    ``exclude_cluster``'s: a live one if any (the most recently heard first), else the last
    heard (its ``status`` says it is not alive); None: no cluster publishes it."""
    statement = text(
        f"SELECT {_RETURNING} FROM registry_blocks b JOIN inference_servers s"
        " ON s.id = b.server_id WHERE b.block_id = :block AND b.public"
        " AND (CAST(:exclude AS text) IS NULL"
        " OR s.doc #>> '{inference_server_metadata,cluster_id}' IS DISTINCT FROM :exclude)"
        f" ORDER BY {ALIVE_SQL} DESC NULLS LAST, s.heartbeat_at DESC NULLS LAST LIMIT 1"
    )
    async with autocommit(engine).connect() as conn:
        row = (
            await conn.execute(statement, {"block": block_id, "exclude": exclude_cluster})
        ).first()
    return _record(row) if row is not None else None


@dataclass(frozen=True, slots=True)
class FoundBlock:
    """A block search found: the block and the live server (a cluster's gateway) running it."""

    block_id: str
    metadata: dict[str, Any]
    public: bool
    server: InferenceServerRecord


async def count_alive(engine: AsyncEngine, server_filter: Any) -> int:
    """How many live servers the filter matches."""
    condition = compile_filter(server_filter, "s.doc", COLUMNS, prefix="c")
    statement = text(
        f"SELECT count(*) FROM inference_servers s WHERE {ALIVE_SQL} AND {condition.text}"
    )
    async with autocommit(engine).connect() as conn:
        return int((await conn.execute(statement, condition.params)).scalar_one())


async def search_blocks(
    engine: AsyncEngine, server_filter: Any, block_filter: Any, limit: int = 100
) -> list[FoundBlock]:
    """Published blocks that ``block_filter`` matches (over their metadata; ``id`` is the
    block id) on live servers that ``server_filter`` matches, in one statement; at most
    ``limit``, each block once (its most recently heard server)."""
    servers = compile_filter(server_filter, "s.doc", COLUMNS, prefix="c")
    blocks = compile_filter(
        block_filter, "b.metadata", {"id": Column("b.block_id", _server_id)}, prefix="b"
    )
    statement = text(
        f"SELECT DISTINCT ON (b.block_id) b.block_id, b.metadata, b.public, {_RETURNING}"
        " FROM registry_blocks b JOIN inference_servers s ON s.id = b.server_id"
        f" WHERE {ALIVE_SQL} AND {servers.text} AND {blocks.text}"
        " ORDER BY b.block_id, s.heartbeat_at DESC LIMIT :limit"
    )
    params = {**servers.params, **blocks.params, "limit": limit}
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(statement, params)).all()
    return [FoundBlock(row.block_id, row.metadata, row.public, _record(row)) for row in rows]
