"""The ``files`` table: one row per stored file, written once its bytes are in the store.

A file is visible while it is not deleted and not expired; ``DELETE`` marks it deleted (at
once invisible) and the row goes when the store let go of its bytes. Every read that answers
a client is scoped to the owning account.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Select,
    Table,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from files.quota import UploadQuota, Usage
from tracker.db import autocommit
from tracker.keyset import PageKey, keyset_page
from tracker.record_tables import File

files = cast(Table, File.__table__)


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A stored file, as its row holds it."""

    id: str
    account_id: int
    #: ``upload`` or ``output``.
    kind: str
    prediction_id: str | None
    name: str
    content_type: str
    size: int
    sha256: str
    md5: str
    etag: str
    metadata: dict[str, Any]
    storage_key: str
    created_at: datetime
    expires_at: datetime | None


def _record(row: RowMapping) -> FileRecord:
    return FileRecord(
        id=row["id"],
        account_id=row["account_id"],
        kind=row["kind"],
        prediction_id=row["prediction_id"],
        name=row["name"],
        content_type=row["content_type"],
        size=row["size"],
        sha256=row["sha256"],
        md5=row["md5"],
        etag=row["etag"],
        metadata=dict(row["metadata"] or {}),
        storage_key=row["storage_key"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
    )


def _live() -> ColumnElement[bool]:
    """Not deleted and not expired."""
    c = files.c
    return and_(c.deleted_at.is_(None), or_(c.expires_at.is_(None), c.expires_at > func.now()))


def _values(record: FileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "account_id": record.account_id,
        "kind": record.kind,
        "prediction_id": record.prediction_id,
        "name": record.name,
        "content_type": record.content_type,
        "size": record.size,
        "sha256": record.sha256,
        "md5": record.md5,
        "etag": record.etag,
        "metadata": record.metadata,
        "storage_key": record.storage_key,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
    }


async def insert_record(engine: AsyncEngine, record: FileRecord) -> None:
    async with autocommit(engine).connect() as conn:
        await conn.execute(insert(files).values(_values(record)))


def _usage_query(account_id: int) -> Select[Any]:
    c = files.c
    return select(func.count(), func.coalesce(func.sum(c.size), 0)).where(
        c.account_id == account_id, c.kind == "upload", _live()
    )


async def upload_usage(engine: AsyncEngine, account_id: int) -> Usage:
    """The account's live uploads: how many, and their bytes (one query)."""
    async with autocommit(engine).connect() as conn:
        count, size = (await conn.execute(_usage_query(account_id))).one()
    return Usage(int(count), int(size))


def _quota_lock(account_id: int) -> int:
    """The advisory lock serialising the account's upload inserts: a signed 64-bit hash."""
    digest = hashlib.blake2b(f"files-quota:{account_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


async def insert_upload(engine: AsyncEngine, record: FileRecord, quota: UploadQuota) -> None:
    """Insert an upload's row if the account's quotas leave room for it (QuotaExceeded else),
    under the account's lock, so uploads written side by side are counted one after another."""
    async with engine.begin() as conn:
        await conn.execute(select(func.pg_advisory_xact_lock(_quota_lock(record.account_id))))
        count, size = (await conn.execute(_usage_query(record.account_id))).one()
        quota.admit(Usage(int(count), int(size)), record.size)
        await conn.execute(insert(files).values(_values(record)))


async def get_live(
    engine: AsyncEngine, file_id: str, account_id: int | None = None
) -> FileRecord | None:
    """The file unless deleted or expired; only the account's own when ``account_id`` is
    given (delivery, whose link is its own credential, reads any)."""
    query = select(files).where(files.c.id == file_id, _live())
    if account_id is not None:
        query = query.where(files.c.account_id == account_id)
    async with autocommit(engine).connect() as conn:
        row = (await conn.execute(query)).mappings().one_or_none()
    return _record(row) if row is not None else None


async def list_for_account(
    engine: AsyncEngine,
    account_id: int,
    *,
    after: PageKey | None,
    before: PageKey | None,
    limit: int,
) -> list[FileRecord]:
    """Newest first. ``after`` pages towards older rows, ``before`` towards newer ones."""
    c = files.c
    query = select(files).where(c.account_id == account_id, c.kind == "upload", _live())
    query = keyset_page(query, c.created_at, c.id, after=after, before=before)
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(query.limit(limit))).mappings().all()
    records = [_record(row) for row in rows]
    if before is not None:
        records.reverse()
    return records


async def keep_as_weights(engine: AsyncEngine, account_id: int, file_id: str) -> FileRecord | None:
    """A live output file of the account's, kept from now on as a training's weights: no
    longer a run's output, which retention removes with the run's data. None when there is
    no such file."""
    c = files.c
    query = (
        update(files)
        .where(c.id == file_id, c.account_id == account_id, c.kind == "output", _live())
        .values(kind="weights", prediction_id=None)
        .returning(files)
    )
    async with autocommit(engine).connect() as conn:
        row = (await conn.execute(query)).mappings().one_or_none()
    return _record(row) if row is not None else None


async def mark_deleted(engine: AsyncEngine, account_id: int, file_id: str) -> str | None:
    """Hide the account's file; its storage key, or None when there was no such live file."""
    c = files.c
    query = (
        update(files)
        .where(c.id == file_id, c.account_id == account_id, _live())
        .values(deleted_at=func.now())
        .returning(c.storage_key)
    )
    async with autocommit(engine).connect() as conn:
        key = (await conn.execute(query)).scalar_one_or_none()
    return cast(str | None, key)


async def remove(engine: AsyncEngine, file_id: str) -> None:
    """Forget a deleted file whose bytes the store has let go of."""
    async with autocommit(engine).connect() as conn:
        await conn.execute(
            delete(files).where(files.c.id == file_id, files.c.deleted_at.is_not(None))
        )


async def live_uploads(
    engine: AsyncEngine, account_id: int, file_ids: Collection[str]
) -> dict[str, FileRecord]:
    """Those of ``file_ids`` that are live uploads of the account, by id: one query."""
    if not file_ids:
        return {}
    c = files.c
    query = select(files).where(
        c.id.in_(list(file_ids)),
        c.account_id == account_id,
        c.kind == "upload",
        _live(),
    )
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return {row["id"]: _record(row) for row in rows}
