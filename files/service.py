"""Files' use cases: store an upload or an output, read, list, delete, deliver, and find the
files a prediction's input refers to.

The store holds every byte before the row is written, so Postgres never names half a file; an
insert that fails removes the stored object again.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import AsyncIterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from files import records
from files.input_refs import FileRefError, references, replace_references
from files.links import FILE_ID, FileLinks
from files.names import clean_content_type, clean_name, new_file_id
from files.quota import QuotaExceeded, UploadQuota
from files.records import FileRecord
from files.settings import FileSettings
from files.store import FileStore, ObjectMissing, OpenedObject, StoreError, TooLarge
from tracker.keyset import PageKey
from tracker.stream_urls import Signature

__all__ = ["FileRecord", "Files", "LinkExpired", "NoSuchFile", "QuotaExceeded"]

log = logging.getLogger(__name__)


class NoSuchFile(Exception):
    """No such live file, or a delivery link that does not name it (forged, wrong name)."""


class LinkExpired(Exception):
    """A genuine delivery link past its expiry."""


class Files:
    def __init__(
        self, engine: AsyncEngine, store: FileStore, links: FileLinks, settings: FileSettings
    ) -> None:
        self.engine = engine
        self.store = store
        self.links = links
        self.settings = settings

    def at(self, base_url: str) -> Files:
        """The same files, their URLs under ``base_url`` (the api a request arrived at)."""
        if base_url.rstrip("/") == self.links.base_url:
            return self
        return Files(self.engine, self.store, self.links.at(base_url), self.settings)

    async def save_upload(
        self,
        account_id: int,
        name: str,
        content_type: str,
        chunks: AsyncIterable[bytes],
        metadata: dict[str, Any],
    ) -> FileRecord:
        """Store an upload (``POST /v1/files``); it expires after ``retention`` seconds.
        Raises the store's ``TooLarge`` (``QuotaExceeded`` past the account's quotas, checked
        before a byte is read) and ``StoreUnavailable``, nothing recorded."""
        quota = self.settings.quota
        max_bytes = self.settings.max_bytes
        usage = None
        if quota.max_files or quota.max_bytes:
            usage = await records.upload_usage(self.engine, account_id)
            max_bytes = quota.room(usage, max_bytes)
        file_id = new_file_id()
        try:
            return await self._save(
                account_id,
                "upload",
                None,
                f"uploads/{account_id}/{file_id}",
                file_id,
                name,
                content_type,
                chunks,
                metadata,
                self.settings.retention,
                max_bytes,
                quota if usage is not None else None,
            )
        except QuotaExceeded:
            raise
        except TooLarge:
            if usage is None or max_bytes == self.settings.max_bytes:
                raise
            raise QuotaExceeded("bytes", quota.max_bytes, usage) from None

    async def save_output(
        self,
        account_id: int,
        prediction_id: str,
        name: str,
        content_type: str,
        chunks: AsyncIterable[bytes],
    ) -> str:
        """Store an output file of a prediction; its delivery URL. It has no expiry of its
        own: the retention sweep removes it with the prediction's data, ``output_retention``
        seconds after the prediction ended (never while it runs)."""
        file_id = new_file_id()
        record = await self._save(
            account_id,
            "output",
            prediction_id,
            f"outputs/{prediction_id}/{file_id}",
            file_id,
            name,
            content_type,
            chunks,
            {},
            None,
            self.settings.max_bytes,
            None,
        )
        return self._lasting_url(record)

    async def save_weights(
        self,
        account_id: int,
        training_id: str,
        name: str,
        content_type: str,
        chunks: AsyncIterable[bytes],
    ) -> str:
        """Store a training's weights; their delivery URL, which lives as long as the file:
        no expiry, and not a run's output (retention keeps them for the version they make)."""
        file_id = new_file_id()
        record = await self._save(
            account_id,
            "weights",
            None,
            f"weights/{training_id}/{file_id}",
            file_id,
            name,
            content_type,
            chunks,
            {"training": training_id},
            None,
            self.settings.max_bytes,
            None,
        )
        return self._lasting_url(record)

    async def keep_as_weights(self, account_id: int, file_id: str) -> str | None:
        """An output file already stored (uploaded by the trainer, or a large data URL the
        receiver moved out) kept as weights (:func:`records.keep_as_weights`); its URL."""
        record = await records.keep_as_weights(self.engine, account_id, file_id)
        return self._lasting_url(record) if record is not None else None

    def _lasting_url(self, record: FileRecord) -> str:
        url = self.links.delivery_url(record, None)
        if url is None:
            raise StoreError("no signing key to make the file's URL with")
        return url

    async def _save(
        self,
        account_id: int,
        kind: str,
        prediction_id: str | None,
        key: str,
        file_id: str,
        name: str,
        content_type: str,
        chunks: AsyncIterable[bytes],
        metadata: dict[str, Any],
        retention: float | None,
        max_bytes: int,
        quota: UploadQuota | None,
    ) -> FileRecord:
        content_type = clean_content_type(content_type)
        stored = await self.store.put(key, chunks, content_type=content_type, max_bytes=max_bytes)
        now = datetime.now(UTC)
        record = FileRecord(
            id=file_id,
            account_id=account_id,
            kind=kind,
            prediction_id=prediction_id,
            name=clean_name(name),
            content_type=content_type,
            size=stored.size,
            sha256=stored.sha256,
            md5=stored.md5,
            etag=stored.etag,
            metadata=metadata,
            storage_key=stored.key,
            created_at=now,
            expires_at=now + timedelta(seconds=retention) if retention is not None else None,
        )
        try:
            if quota is None:
                await records.insert_record(self.engine, record)
            else:
                await records.insert_upload(self.engine, record, quota)
        except BaseException:
            await self._forget_bytes(stored.key)
            raise
        return record

    async def _forget_bytes(self, key: str) -> None:
        try:
            await self.store.delete(key)
        except StoreError as error:
            log.warning("stored object %s could not be removed: %r", key, error)

    async def get(self, account_id: int, file_id: str) -> FileRecord | None:
        """The account's live file (None: missing, another account's, deleted, expired)."""
        if not FILE_ID.fullmatch(file_id):
            return None
        return await records.get_live(self.engine, file_id, account_id)

    async def list(
        self, account_id: int, after: PageKey | None, before: PageKey | None, limit: int
    ) -> builtins.list[FileRecord]:
        """The account's live uploads, newest first, up to ``limit`` from a cursor's key."""
        return await records.list_for_account(
            self.engine, account_id, after=after, before=before, limit=limit
        )

    async def delete(self, account_id: int, file_id: str) -> bool:
        """Delete the account's file; False when it had none such. The row goes once the
        store let go of the bytes (a store that fails leaves it marked, invisible)."""
        if not FILE_ID.fullmatch(file_id):
            return False
        key = await records.mark_deleted(self.engine, account_id, file_id)
        if key is None:
            return False
        try:
            await self.store.delete(key)
        except StoreError as error:
            log.warning("file %s deleted; its bytes stay until the sweep: %r", file_id, error)
            return True
        await records.remove(self.engine, file_id)
        return True

    async def open_delivery(
        self, file_id: str, token: str, name: str | None = None
    ) -> tuple[FileRecord, OpenedObject]:
        """The file a delivery link names, opened. Raises :class:`NoSuchFile` (forged link,
        wrong name, no such live file, bytes gone), :class:`LinkExpired`, or the store's
        ``StoreUnavailable``."""
        if not FILE_ID.fullmatch(file_id):
            raise NoSuchFile(file_id)
        verdict = await self.links.check(file_id, token)
        if verdict is Signature.FORGED:
            raise NoSuchFile(file_id)
        record = await records.get_live(self.engine, file_id)
        if record is None or (name is not None and name != record.name):
            raise NoSuchFile(file_id)
        if verdict is Signature.EXPIRED:
            raise LinkExpired(file_id)
        try:
            opened = await self.store.open(record.storage_key)
        except ObjectMissing as error:
            raise NoSuchFile(file_id) from error
        return record, opened

    async def input_links(
        self, account_id: int, input: dict[str, Any], base_url: str | None = None
    ) -> tuple[dict[str, Any], builtins.list[FileRefError]]:
        """``input`` with each file reference (a URL whose path is ``/v1/files/{id}``)
        replaced by a delivery URL valid ``input_link_ttl`` seconds, and an error for each
        reference that names no live upload of the account (``input.<path>``). One query for
        all references, none without any; an input without references comes back as is.

        The delivery URLs are for runners: under ``CONDUIT_FILES_INTERNAL_URL`` when set (how
        runners reach the api), else under ``base_url`` (the api a request arrived at), else
        under the public URL."""
        found = list(references(input, ("input",)))
        if not found:
            return input, []
        uploads = await records.live_uploads(
            self.engine, account_id, {file_id for _, file_id in found}
        )
        errors = [
            FileRefError(".".join(map(str, path)), "file not found")
            for path, file_id in found
            if file_id not in uploads
        ]
        expires = int(time.time() + self.settings.input_link_ttl)
        links = self.links
        if self.settings.internal_url or base_url:
            links = links.at(self.settings.internal_url or base_url or "")
        urls = {file_id: links.delivery_url(record, expires) for file_id, record in uploads.items()}
        return replace_references(input, urls), errors
