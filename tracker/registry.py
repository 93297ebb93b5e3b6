"""The registry of inference servers: records the seed's ``InferenceServer`` describes, kept
for search and discovery, changed with MongoDB update documents and found with MongoDB filters.

A record is ``inference_server_id`` (a uuid4 the server draws), ``inference_server_name``,
``inference_server_metadata`` (free JSON), ``inference_server_tags`` (a list of strings) and
``inference_server_public_url``, plus ``registered_at`` and ``updated_at``, which the server
keeps. The four fields a client writes are one JSONB document (``inference_servers.doc``); the
id and times are columns. Filters and updates are translated to SQL (:mod:`tracker.mongo_json`)
and evaluated by Postgres: a query never loads rows to test them, and an update is one
``UPDATE`` of the locked row whose new document is an expression of the old one.

An update may not make a record something other than the seed's shape: the name and URL are
strings, set whole; the tags a list of strings, set whole or changed with ``$push``,
``$addToSet`` and ``$pull``; the metadata a document, set whole or changed anywhere inside.
The server's own fields are never written by an update.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tracker.db import autocommit
from tracker.mongo_json import Column, MongoError, compile_filter
from tracker.mongo_updates import Change, update_select
from tracker.render import iso

__all__ = [
    "FIELDS",
    "SERVER_FIELDS",
    "InferenceServerRecord",
    "check_changes",
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
SERVER_FIELDS = ("inference_server_id", "registered_at", "updated_at")


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


#: Fields filters compare in their own columns.
COLUMNS = {
    "inference_server_id": Column("id", _server_id),
    "registered_at": Column("registered_at", _timestamp),
    "updated_at": Column("updated_at", _timestamp),
}


@dataclass(frozen=True, slots=True)
class InferenceServerRecord:
    id: str
    doc: dict[str, Any]
    registered_at: datetime
    updated_at: datetime


def render(record: InferenceServerRecord) -> dict[str, Any]:
    return {
        "inference_server_id": record.id,
        **{name: record.doc.get(name) for name in FIELDS},
        "registered_at": iso(record.registered_at),
        "updated_at": iso(record.updated_at),
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


_RETURNING = "id, doc, registered_at, updated_at"


def _record(row: Any) -> InferenceServerRecord:
    return InferenceServerRecord(row.id, row.doc, row.registered_at, row.updated_at)


async def create(engine: AsyncEngine, doc: dict[str, Any]) -> InferenceServerRecord:
    """Register a server: ``doc`` holds the four fields a client writes (checked)."""
    statement = text(
        "INSERT INTO inference_servers (id, doc) VALUES (:id, CAST(:doc AS jsonb))"
        f" RETURNING {_RETURNING}"
    )
    async with autocommit(engine).connect() as conn:
        row = (
            await conn.execute(statement, {"id": str(uuid.uuid4()), "doc": json.dumps(doc)})
        ).one()
    return _record(row)


async def get(engine: AsyncEngine, server_id: str) -> InferenceServerRecord | None:
    statement = text(f"SELECT {_RETURNING} FROM inference_servers WHERE id = :id")
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
        " upd AS (UPDATE inference_servers t SET doc = new.doc, updated_at = now() FROM new"
        " WHERE t.id = new.id AND new.failed IS NULL"
        " RETURNING t.id, t.doc, t.registered_at, t.updated_at)"
        " SELECT new.failed, upd.id, upd.doc, upd.registered_at, upd.updated_at"
        " FROM new LEFT JOIN upd ON TRUE"
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
    condition = compile_filter(document, "doc", COLUMNS)
    statement = text(
        f"SELECT {_RETURNING} FROM inference_servers WHERE {condition.text}"
        " ORDER BY registered_at, id LIMIT :limit"
    )
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(statement, {**condition.params, "limit": limit})).all()
    return [_record(row) for row in rows]
