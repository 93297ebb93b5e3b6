"""Where a run's output files go: the store behind :class:`files.service.Files`.

The receiver streams what runners upload (and the data URLs it takes out of webhooks) through
:class:`OutputFiles`; a :class:`~files.data_urls.DataUrlKeeper` does the same for the
output of a snapshot already parsed (a Conduit runner's snapshot stream). An output file that
cannot be stored is output that cannot be kept: :func:`unkept_reason` words it, and the attempt
fails the prediction with it (``Attempt.cannot_keep``).

Stock Cog without an upload URL sends an iterator's whole output so far in each webhook, every
earlier file again as a data URL: :func:`save_once` keeps one copy of each (by the digest of
its bytes) and hands out the first copy's URL again, so the output's URLs stay as they were.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from files.data_urls import SAVE_ERRORS, DataUrlKeeper, DataUrls, unkept_reason
from files.links import delivery_file_id

__all__ = [
    "SAVE_ERRORS",
    "DataUrlKeeper",
    "OutputFiles",
    "OutputStore",
    "save_once",
    "unkept_reason",
]

log = logging.getLogger(__name__)


class OutputFiles(Protocol):
    """Stores one output file of a prediction; returns its delivery URL. Raises the store's
    errors (``TooLarge``, ``StoreUnavailable``) or a database outage's."""

    async def save_output(
        self,
        account_id: int,
        prediction_id: str,
        name: str,
        content_type: str,
        chunks: AsyncIterable[bytes],
    ) -> str: ...

    async def delete(self, account_id: int, file_id: str) -> bool: ...

    async def input_links(
        self, account_id: int, input: dict[str, Any], base_url: str | None = None
    ) -> tuple[dict[str, Any], list[Any]]: ...


@dataclass(frozen=True, slots=True)
class OutputStore(DataUrls):
    """Where this director keeps output files and how large a data URL may stay inline (as
    for any run's), and how a prediction's input files reach its runner."""

    files: OutputFiles

    async def runner_input(self, account_id: int, input: dict[str, Any]) -> tuple[Any, str | None]:
        """``input`` as the runner gets it: each file reference (``/v1/files/{id}``) a signed
        delivery URL it fetches without a token; with the reason when a referenced upload is
        gone (deleted or expired since the prediction was created)."""
        linked, errors = await self.files.input_links(account_id, input)
        if errors:
            return input, "; ".join(f"{e.field}: {e.message}" for e in errors)
        return linked, None


async def save_once(
    files: OutputFiles,
    kept: dict[str, str],
    account_id: int,
    prediction_id: str,
    name: str,
    content_type: str,
    chunks: AsyncIterable[bytes],
) -> str:
    """Store one output file, unless ``kept`` (digest of an earlier file's type and bytes ->
    its URL) shows this run stored the same before: then the new copy goes, and the earlier
    URL is the answer. The digest is only known once every byte went by, so a repeat is
    written and deleted again; the store keeps one copy."""
    digest = hashlib.sha256(content_type.encode() + b"\0")

    async def hashed() -> AsyncIterator[bytes]:
        async for chunk in chunks:
            digest.update(chunk)
            yield chunk

    url = await files.save_output(account_id, prediction_id, name, content_type, hashed())
    earlier = kept.setdefault(digest.hexdigest(), url)
    if earlier != url:
        await _discard(files, account_id, url)
    return earlier


async def _discard(files: OutputFiles, account_id: int, url: str) -> None:
    file_id = delivery_file_id(url)
    if file_id is None:
        return
    try:
        await files.delete(account_id, file_id)
    except SAVE_ERRORS as error:  # the copy stays until its retention ends
        log.warning("repeated output file %s could not be deleted: %r", file_id, error)
