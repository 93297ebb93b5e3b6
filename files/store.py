"""The byte store behind files: what every backend (``local``, ``s3``) provides.

Bytes are streamed in and out in chunks; no backend holds a whole file in memory. A ``put``
either stores every byte under its key or leaves nothing behind (a refused or failed upload is
removed), so a record in Postgres never points at half a file.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import Protocol

#: Bytes per chunk a store reads and yields by default.
CHUNK_BYTES = 256 * 1024


class StoreError(Exception):
    """Base of the store's own errors."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached or failed the operation: an outage (503 on upload; a
    prediction whose output cannot be kept fails with this reason)."""


class ObjectMissing(StoreError):
    """No object under the key (deleted, expired, or never written)."""


class TooLarge(StoreError):
    """The stream passed ``max_bytes``; nothing was kept."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the file passed the limit of {max_bytes} bytes")
        self.max_bytes = max_bytes


@dataclass(frozen=True, slots=True)
class StoredObject:
    """What a finished ``put`` wrote: its key, size and digests (lowercase hex)."""

    key: str
    size: int
    sha256: str
    md5: str
    #: The store's entity tag (quotes stripped); an md5 of the bytes where the store says none.
    etag: str


class ByteChunks(Protocol):
    """An object's bytes as they are read (an async iterator); ``aclose`` releases the
    backend's stream early."""

    def __aiter__(self) -> ByteChunks: ...

    async def __anext__(self) -> bytes: ...

    async def aclose(self) -> None: ...


class ChunkReader:
    """A backend's read stream as :class:`ByteChunks`: ``_read`` gives the next chunk (empty
    at the end), ``_release`` lets go of the stream. It is released at the end, on an error,
    or by ``aclose`` (also when iteration never started), once."""

    _open = True

    async def _read(self) -> bytes:
        raise NotImplementedError

    async def _release(self) -> None:
        raise NotImplementedError

    def __aiter__(self) -> ChunkReader:
        return self

    async def __anext__(self) -> bytes:
        if not self._open:
            raise StopAsyncIteration
        try:
            data = await self._read()
        except BaseException:
            await self.aclose()
            raise
        if not data:
            await self.aclose()
            raise StopAsyncIteration
        return data

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            await self._release()


@dataclass(slots=True)
class OpenedObject:
    """An object opened for reading: its size is known before the first byte is sent.
    ``chunks`` must be consumed or closed (``aclose``) to release the backend's stream."""

    size: int
    content_type: str | None
    chunks: ByteChunks


class FileStore(Protocol):
    """Where files' bytes live. Keys are ``/``-separated relative paths chosen by Conduit
    (never by a client)."""

    #: ``local`` or ``s3``: for logs, metrics and ``/readyz``.
    name: str

    async def put(
        self,
        key: str,
        chunks: AsyncIterable[bytes],
        *,
        content_type: str,
        max_bytes: int,
    ) -> StoredObject:
        """Stream ``chunks`` into ``key`` (replacing what was there). Raises
        :class:`TooLarge` past ``max_bytes`` and :class:`StoreUnavailable` when the backend
        fails; either way nothing is left under ``key``."""
        ...

    async def open(self, key: str, *, chunk_bytes: int = CHUNK_BYTES) -> OpenedObject:
        """Open ``key`` for reading. Raises :class:`ObjectMissing` or
        :class:`StoreUnavailable` before any byte is read."""
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error. Raises :class:`StoreUnavailable`."""
        ...

    async def check(self) -> None:
        """Raise :class:`StoreUnavailable` when the backend cannot serve (readiness)."""
        ...

    async def close(self) -> None:
        """Release connections; the store is not used afterwards."""
        ...
