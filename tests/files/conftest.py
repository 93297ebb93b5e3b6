"""The file store under test: ``file_store`` runs a test once per backend (``local`` on a
temporary directory, ``s3`` on a real S3-speaking server on loopback)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from files.local import LocalStore
from files.s3 import S3Store
from files.store import FileStore
from tests.fixtures.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server, s3_server

BUCKET = "conduit-files"

#: Everything a store holds: finished objects, and anything half-written (temporary files,
#: multipart uploads in progress).
Contents = Callable[[], Awaitable[list[str]]]


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The session's S3 server; its bucket :data:`BUCKET` is created by ``s3_bucket``."""
    with s3_server(tmp_path_factory.mktemp("s3-logs")) as server:
        yield server


@pytest.fixture(scope="session")
async def s3_bucket(s3: S3Server) -> S3Server:
    await s3.create_bucket(BUCKET)
    return s3


def s3_store(server: S3Server, prefix: str = "", **options: object) -> S3Store:
    """An ``s3`` store on ``server``'s bucket :data:`BUCKET`."""
    return S3Store(
        bucket=BUCKET,
        endpoint_url=server.endpoint_url,
        region=REGION,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        prefix=prefix,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest) -> S3Server | None:
    """``None`` for the ``local`` backend, the S3 server (bucket made) for ``s3``: the server
    starts only when an ``s3`` case runs."""
    if request.param == "local":
        return None
    server: S3Server = request.getfixturevalue("s3_bucket")
    return server


@pytest.fixture
async def file_store(backend: S3Server | None, tmp_path: Path) -> AsyncIterator[FileStore]:
    """A fresh, empty store of each backend (``s3``: its own prefix in the shared bucket)."""
    store: FileStore
    if backend is None:
        store = LocalStore(tmp_path / "files")
    else:
        store = s3_store(backend, prefix=f"{uuid.uuid4().hex}/")
    yield store
    await store.close()


@pytest.fixture
def store_contents(backend: S3Server | None, file_store: FileStore) -> Contents:
    """What ``file_store`` holds, as names relative to it, half-written things included."""

    async def local() -> list[str]:
        assert isinstance(file_store, LocalStore)
        root = file_store.root
        return sorted(
            str(Path(d, f).relative_to(root)) for d, _, files in os.walk(root) for f in files
        )

    async def s3() -> list[str]:
        assert isinstance(file_store, S3Store) and backend is not None
        objects, uploads = await backend.listing(BUCKET, file_store.prefix)
        cut = len(file_store.prefix)
        return sorted([k[cut:] for k in objects] + [f"{k[cut:]} (upload)" for k in uploads])

    return local if backend is None else s3
