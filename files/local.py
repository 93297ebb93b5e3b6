"""The ``local`` file store: files under one directory on the host's disk.

A put writes ``<key>.tmp-<random>`` beside the final name and renames it into place once every
byte is on disk (and flushed), so a reader sees the whole file or none of it; a refused or
failed put removes its temporary file. Disk work runs in threads so the event loop never waits
on it, and digests are computed as the bytes pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from files.store import (
    CHUNK_BYTES,
    ChunkReader,
    ObjectMissing,
    OpenedObject,
    StoredObject,
    StoreUnavailable,
    TooLarge,
)

#: Bytes gathered from the source before one write in a thread (fewer thread hops).
WRITE_BYTES = 1024 * 1024


def check_key(key: str) -> str:
    """Return ``key`` when it is a plain relative ``/``-separated path; ``ValueError`` else.

    Keys are Conduit's own, but a key must never reach outside the store's root whatever
    builds it: no absolute path, no ``..``, no empty or ``.`` segment, no backslash or NUL."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise ValueError(f"invalid storage key {key!r}")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid storage key {key!r}")
    return key


class Digests:
    """sha256 and md5 of a stream, updated chunk by chunk."""

    def __init__(self) -> None:
        self.size = 0
        self._sha256 = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self.size += len(data)
        self._sha256.update(data)
        self._md5.update(data)

    @property
    def sha256(self) -> str:
        return self._sha256.hexdigest()

    @property
    def md5(self) -> str:
        return self._md5.hexdigest()


class _FileChunks(ChunkReader):
    """Chunks of an open file, each read in a thread."""

    def __init__(self, handle: BinaryIO, chunk_bytes: int) -> None:
        self._handle = handle
        self._chunk_bytes = chunk_bytes

    async def _read(self) -> bytes:
        try:
            return await asyncio.to_thread(self._handle.read, self._chunk_bytes)
        except OSError as e:
            raise StoreUnavailable(f"reading a stored file failed: {e}") from e

    async def _release(self) -> None:
        self._handle.close()


class LocalStore:
    """A :class:`~files.store.FileStore` over a directory (created on first use)."""

    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: str) -> Path:
        """Where ``key`` lives on disk (``ValueError`` for a key that would leave the root)."""
        return self.root.joinpath(*PurePosixPath(check_key(key)).parts)

    async def put(
        self,
        key: str,
        chunks: AsyncIterable[bytes],
        *,
        content_type: str,
        max_bytes: int,
    ) -> StoredObject:
        path = self.path(key)
        temp = path.with_name(f"{path.name}.tmp-{secrets.token_hex(8)}")
        digests = Digests()
        async with _disk(f"writing {key}"):
            handle = await asyncio.to_thread(_create, temp)
        try:
            pending = bytearray()
            async for chunk in chunks:  # the source's own errors pass as they are
                if digests.size + len(pending) + len(chunk) > max_bytes:
                    raise TooLarge(max_bytes)
                pending += chunk
                if len(pending) >= WRITE_BYTES:
                    async with _disk(f"writing {key}"):
                        await asyncio.to_thread(_write, handle, pending, digests)
                    pending = bytearray()
            async with _disk(f"writing {key}"):
                await asyncio.to_thread(_write, handle, pending, digests)
                await asyncio.to_thread(_finish, handle, temp, path)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(_discard, handle, temp))
            raise
        return StoredObject(
            key=key, size=digests.size, sha256=digests.sha256, md5=digests.md5, etag=digests.md5
        )

    async def open(self, key: str, *, chunk_bytes: int = CHUNK_BYTES) -> OpenedObject:
        path = self.path(key)
        try:
            handle, size = await asyncio.to_thread(_open, path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectMissing(key) from e
        except OSError as e:
            raise StoreUnavailable(f"reading {key} failed: {e}") from e
        return OpenedObject(size=size, content_type=None, chunks=_FileChunks(handle, chunk_bytes))

    async def delete(self, key: str) -> None:
        path = self.path(key)
        try:
            await asyncio.to_thread(path.unlink, missing_ok=True)
        except OSError as e:
            raise StoreUnavailable(f"deleting {key} failed: {e}") from e

    async def check(self) -> None:
        try:
            await asyncio.to_thread(_check_writable, self.root)
        except OSError as e:
            raise StoreUnavailable(f"the files directory {self.root} is not usable: {e}") from e

    async def close(self) -> None:
        return None


@asynccontextmanager
async def _disk(what: str) -> AsyncIterator[None]:
    """A disk failure during ``what`` (full, read-only, gone) as :class:`StoreUnavailable`."""
    try:
        yield
    except OSError as e:
        raise StoreUnavailable(f"{what} failed: {e}") from e


def _create(temp: Path) -> BinaryIO:
    temp.parent.mkdir(parents=True, exist_ok=True)
    return temp.open("xb")


def _write(handle: BinaryIO, data: bytearray, digests: Digests) -> None:
    digests.update(data)
    handle.write(data)


def _finish(handle: BinaryIO, temp: Path, path: Path) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
    os.replace(temp, path)


def _discard(handle: BinaryIO, temp: Path) -> None:
    try:
        handle.close()
    finally:
        temp.unlink(missing_ok=True)


def _open(path: Path) -> tuple[BinaryIO, int]:
    handle = path.open("rb")
    try:
        return handle, os.fstat(handle.fileno()).st_size
    except BaseException:
        handle.close()
        raise


def _check_writable(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    if not os.access(root, os.W_OK | os.X_OK):
        raise PermissionError(f"{root} is not writable")
