"""The file store, one suite over both backends: bytes in and out whole, digests right,
nothing left behind by a refused or failed put, a bounded memory whatever the file's size,
and an unreachable S3 as ``StoreUnavailable`` (never a client library's exception)."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from core.ports import free_port
from files.local import LocalStore
from files.s3 import PART_BYTES, S3Store
from files.settings import FileSettings
from files.store import (
    FileStore,
    ObjectMissing,
    StoreUnavailable,
    TooLarge,
)
from tests.files.conftest import BUCKET, Contents, s3_store
from tests.fixtures.s3_server import S3Server, s3_server

MIB = 1024 * 1024


def payload(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


async def chunked(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def read_all(store: FileStore, key: str, chunk_bytes: int = 64 * 1024) -> bytes:
    opened = await store.open(key, chunk_bytes=chunk_bytes)
    out = bytearray()
    async for chunk in opened.chunks:
        assert len(chunk) <= chunk_bytes
        out += chunk
    assert len(out) == opened.size
    return bytes(out)


async def test_round_trip_through_several_parts(
    file_store: FileStore, store_contents: Contents
) -> None:
    # 20 MiB and a bit, in uneven chunks: three parts of a multipart upload on S3.
    data = payload(2 * PART_BYTES + 4 * MIB + 123)
    stored = await file_store.put(
        "uploads/1/f1", chunked(data, MIB + 17), content_type="image/png", max_bytes=100 * MIB
    )

    assert stored.key == "uploads/1/f1"
    assert stored.size == len(data)
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    assert stored.md5 == hashlib.md5(data).hexdigest()
    assert stored.etag and '"' not in stored.etag
    assert await store_contents() == ["uploads/1/f1"]

    opened = await file_store.open("uploads/1/f1")
    assert opened.size == len(data)
    assert opened.content_type in (None, "image/png")
    await opened.chunks.aclose()  # released unread
    assert await read_all(file_store, "uploads/1/f1") == data

    await file_store.delete("uploads/1/f1")
    await file_store.delete("uploads/1/f1")  # a missing key is no error
    assert await store_contents() == []
    with pytest.raises(ObjectMissing):
        await file_store.open("uploads/1/f1")


async def test_small_and_empty_files(file_store: FileStore) -> None:
    for key, data in (("a/small", b"hello, files"), ("a/empty", b"")):
        stored = await file_store.put(
            key,
            chunked(data, 5) if data else chunked(data, 1),
            content_type="text/plain",
            max_bytes=len(data),
        )
        assert (stored.size, stored.md5) == (len(data), hashlib.md5(data).hexdigest())
        # One request on S3 (no multipart upload): its entity tag is the md5.
        assert stored.etag == stored.md5
        assert await read_all(file_store, key) == data


async def test_put_replaces_an_object(file_store: FileStore) -> None:
    await file_store.put("k", chunked(b"first", 2), content_type="text/plain", max_bytes=99)
    await file_store.put("k", chunked(b"second!", 3), content_type="text/plain", max_bytes=99)
    assert await read_all(file_store, "k") == b"second!"


@pytest.mark.parametrize("limit", [1000, PART_BYTES + MIB], ids=["before-a-part", "after-a-part"])
async def test_too_large_leaves_nothing(
    file_store: FileStore, store_contents: Contents, limit: int
) -> None:
    with pytest.raises(TooLarge) as raised:
        await file_store.put(
            "big", chunked(payload(3 * PART_BYTES), MIB), content_type="x/y", max_bytes=limit
        )
    assert raised.value.max_bytes == limit
    assert await store_contents() == []
    with pytest.raises(ObjectMissing):
        await file_store.open("big")


async def test_a_failing_source_leaves_nothing(
    file_store: FileStore, store_contents: Contents
) -> None:
    async def broken() -> AsyncIterator[bytes]:
        for _ in range(PART_BYTES // MIB + 2):  # past the first part on S3
            yield payload(MIB)
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        await file_store.put("half", broken(), content_type="x/y", max_bytes=100 * MIB)
    assert await store_contents() == []


async def test_missing_key(file_store: FileStore) -> None:
    with pytest.raises(ObjectMissing):
        await file_store.open("outputs/p1/nothing")


@pytest.mark.parametrize("key", ["../x", "/abs", "a/../../b", "a//b", "./a", "", "a\\b"])
async def test_keys_stay_inside_the_store(file_store: FileStore, key: str) -> None:
    with pytest.raises(ValueError):
        await file_store.put(key, chunked(b"x", 1), content_type="x/y", max_bytes=9)
    with pytest.raises(ValueError):
        await file_store.open(key)
    with pytest.raises(ValueError):
        await file_store.delete(key)


async def test_check_passes(file_store: FileStore) -> None:
    await file_store.check()


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_memory_stays_bounded_whatever_the_size(file_store: FileStore) -> None:
    size = 50 * MIB
    block = payload(MIB)

    async def source(peak: list[int]) -> AsyncIterator[bytes]:
        for i in range(size // MIB):
            peak[0] = max(peak[0], rss_bytes())
            yield block[:-1] + bytes([i])  # a new 1 MiB chunk each time, freed once consumed

    # Warm up (client, connections, the allocator's arenas), then measure the peak.
    await file_store.put(
        "warm", chunked(payload(PART_BYTES + MIB), MIB), content_type="x/y", max_bytes=size
    )
    before = rss_bytes()
    peak = [before]
    stored = await file_store.put("big", source(peak), content_type="x/y", max_bytes=size)
    peak[0] = max(peak[0], rss_bytes())

    assert stored.size == size
    growth = peak[0] - before
    # The whole file held at once would be 50 MiB; a streaming put holds about one part (the
    # one being sent, filled in place and never copied: about 9 MiB here, where a copy of each
    # part took it to 20-27 MiB).
    assert growth < 2 * PART_BYTES, f"RSS grew by {growth / MIB:.1f} MiB"


# --- S3 without a server -----------------------------------------------------------------


async def test_s3_with_nothing_listening_is_unavailable() -> None:
    store = S3Store(
        bucket=BUCKET,
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        access_key_id="test",
        secret_access_key="test",
        connect_timeout=1.0,
        max_attempts=2,
    )
    try:
        with pytest.raises(StoreUnavailable):
            await store.check()
        with pytest.raises(StoreUnavailable):
            await store.put("k", chunked(b"data", 2), content_type="x/y", max_bytes=99)
        with pytest.raises(StoreUnavailable):
            await store.open("k")
        with pytest.raises(StoreUnavailable):
            await store.delete("k")
    finally:
        await store.close()


async def test_s3_going_down_mid_upload_is_unavailable(tmp_path: Path) -> None:
    with ExitStack() as stack:
        server: S3Server = await asyncio.to_thread(stack.enter_context, s3_server(tmp_path))
        await server.create_bucket(BUCKET)
        store = s3_store(server, connect_timeout=1.0, max_attempts=2)
        try:

            async def source() -> AsyncIterator[bytes]:
                for i in range(3 * PART_BYTES // MIB):
                    if i == PART_BYTES // MIB + 1:  # the first part is in
                        objects, uploads = await server.listing(BUCKET)
                        assert (objects, uploads) == ([], ["big"])
                        await asyncio.to_thread(server.stop)
                    yield payload(MIB, seed=i)

            with pytest.raises(StoreUnavailable):
                await store.put("big", source(), content_type="x/y", max_bytes=100 * MIB)
            with pytest.raises(StoreUnavailable):
                await store.check()
            with pytest.raises(StoreUnavailable):
                await store.open("big")
        finally:
            await store.close()


async def test_s3_missing_bucket_is_unavailable(s3_bucket: S3Server) -> None:
    store = s3_store(s3_bucket)
    store.bucket = "no-such-bucket"
    try:
        with pytest.raises(StoreUnavailable):
            await store.check()
        with pytest.raises(StoreUnavailable):
            await store.put("k", chunked(b"data", 2), content_type="x/y", max_bytes=99)
    finally:
        await store.close()


# --- settings ----------------------------------------------------------------------------


def test_settings_build_the_configured_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CONDUIT_FILES_DIR", str(tmp_path))
    local = FileSettings().store()
    assert isinstance(local, LocalStore) and local.root == tmp_path

    monkeypatch.setenv("CONDUIT_FILES_BACKEND", "s3")
    with pytest.raises(ValueError):
        FileSettings().store()

    monkeypatch.setenv("CONDUIT_FILES_S3_BUCKET", "b")
    monkeypatch.setenv("CONDUIT_FILES_S3_PREFIX", "conduit/")
    monkeypatch.setenv("CONDUIT_FILES_S3_SECRET_ACCESS_KEY", "s3cr3t")
    settings = FileSettings()
    assert "s3cr3t" not in repr(settings)
    s3 = settings.store()
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix) == ("b", "conduit/")
    assert settings.max_bytes == 100 * MIB and settings.inline_max == 262144
