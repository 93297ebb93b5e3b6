"""Files with the ``s3`` backend, end to end: an api and a director of this module's own, both
keeping file bytes in a bucket of a real S3-speaking server (``moto_server``) on loopback, and
a stock Cog model (cog 0.23.1) with a ``Path`` input and a ``Path`` output uploading through
its ``--upload-url``.

The files API behaves the same on either backend; with the store down an upload is a 503
``store_unavailable`` and a prediction whose output must be stored fails at once with the
reason, with nothing written to the ``files`` table; once the store is back, the deployment
runs again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest
from replicate.client import Client
from sqlalchemy import text

from core.ports import free_port
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status
from tests.fixtures.cog_server import FIXTURES, cog_server
from tests.fixtures.processes import Launcher
from tests.fixtures.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, s3_server
from tracker.db import make_engine
from tracker.stream_urls import StreamSigner

pytestmark = pytest.mark.e2e

MODEL_DIR = FIXTURES / "cog_file_model"
DEPLOYMENT = "test/cog-files-s3"
BUCKET = "conduit-e2e-files"
#: The own processes' signing key, so that a test can make a file's delivery URL itself.
SIGNING_KEY = secrets.token_urlsafe(32)
MIB = 1024 * 1024
#: Long enough that a prediction failed within a test's wait did not fail by timing out.
PREDICTION_TIMEOUT = 1800.0


def made_bytes(size: int, seed: int) -> bytes:
    """What the fixture model makes for ``size`` and ``seed`` (1 MiB draws, as it writes)."""
    rng = random.Random(seed)
    parts, left = [], size
    while left > 0:
        n = min(MIB, left)
        parts.append(rng.randbytes(n))
        left -= n
    return b"".join(parts)


def _s3_env(server: S3Server) -> dict[str, str]:
    return {
        "CONDUIT_FILES_BACKEND": "s3",
        "CONDUIT_FILES_S3_ENDPOINT_URL": server.endpoint_url,
        "CONDUIT_FILES_S3_BUCKET": BUCKET,
        "CONDUIT_FILES_S3_ACCESS_KEY_ID": ACCESS_KEY,
        "CONDUIT_FILES_S3_SECRET_ACCESS_KEY": SECRET_KEY,
        "CONDUIT_STREAM_SIGNING_KEY": SIGNING_KEY,
    }


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """This module's own S3 server (a test stops and restarts it), its bucket made."""
    with s3_server(tmp_path_factory.mktemp("s3-e2e")) as server:
        asyncio.run(server.create_bucket(BUCKET))
        yield server


@pytest.fixture(scope="module")
def s3_api(launcher: Launcher, s3: S3Server) -> Iterator[str]:
    with launcher.own_api(_s3_env(s3)) as url:
        yield url


@pytest.fixture(scope="module")
def local_api(launcher: Launcher) -> Iterator[str]:
    with launcher.own_api({"CONDUIT_STREAM_SIGNING_KEY": SIGNING_KEY}) as url:
        yield url


@pytest.fixture(scope="module")
def deployment(
    launcher: Launcher,
    admin: Admin,
    s3: S3Server,
    s3_api: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """The Cog file model behind a director that stores its outputs in ``s3``'s bucket and
    renders their URLs against ``s3_api``."""
    receiver_port = free_port()
    logdir = tmp_path_factory.mktemp("cog-s3")
    upload_url = f"http://127.0.0.1:{receiver_port}/upload/"
    with cog_server(MODEL_DIR, logdir, "--upload-url", upload_url) as url:
        admin.create_model(DEPLOYMENT, url)
        admin.create_deployment(
            DEPLOYMENT,
            DEPLOYMENT,
            shards=1,
            visibility="public",
            prediction_timeout=PREDICTION_TIMEOUT,
        )
        director = launcher.director(
            DEPLOYMENT,
            url,
            concurrency=1,
            env={**_s3_env(s3), "CONDUIT_PUBLIC_URL": s3_api},
            receiver_port=str(receiver_port),
        )
        try:
            yield DEPLOYMENT
        finally:
            director.stop()


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def files_api(backend: str, request: pytest.FixtureRequest) -> str:
    """The api of ``backend``: ``local`` (a directory) or ``s3`` (the bucket)."""
    url: str = request.getfixturevalue(f"{backend}_api")
    return url


def _client(api_url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _account(admin: Admin) -> tuple[str, str]:
    """A new account: its name and token."""
    name = f"files-s3-{uuid.uuid4().hex[:10]}"
    return name, admin.create_account(name)


def _bucket_keys(server: S3Server) -> list[str]:
    """The bucket's objects; fails if a multipart upload was left in progress."""
    objects, uploads = asyncio.run(server.listing(BUCKET))
    assert uploads == [], uploads
    return objects


def _file_rows(database_url: str, account: str) -> list[dict[str, Any]]:
    """The ``files`` rows of ``account``, deleted ones included."""

    async def rows() -> list[dict[str, Any]]:
        engine = make_engine(database_url, pool_size=1)
        try:
            async with engine.connect() as connection:
                result = await connection.execute(
                    text(
                        "SELECT f.id, f.kind, f.prediction_id, f.storage_key FROM files f"
                        " JOIN accounts a ON a.id = f.account_id WHERE a.name = :name"
                    ),
                    {"name": account},
                )
                return [dict(row._mapping) for row in result]
        finally:
            await engine.dispose()

    return asyncio.run(rows())


def _delivery_url(api_url: str, file: dict[str, Any]) -> str:
    sig = StreamSigner(key=SIGNING_KEY.encode()).sign("file", file["id"], 0)
    return f"{api_url}/v1/files/{file['id']}/0.{sig}/{quote(file['name'], safe='')}"


def _bytes_at(url: str) -> bytes:
    """The bytes behind a delivery URL, fetched as anyone would: no token, no redirect."""
    answer = httpx.get(url, timeout=60, follow_redirects=False)
    assert answer.status_code == 200, (answer.status_code, answer.text[:300])
    return answer.content


def _file_id(delivery_url: str) -> str:
    """The file id in ``{base}/v1/files/{id}/{token}/{name}``."""
    parts = urlsplit(delivery_url).path.split("/")
    assert parts[1:3] == ["v1", "files"], delivery_url
    return parts[3]


def _held(backend: str, launcher: Launcher, s3: S3Server, storage_key: str) -> bool:
    """Whether ``backend``'s store holds an object under ``storage_key``."""
    if backend == "s3":
        return storage_key in _bucket_keys(s3)
    return (Path(launcher.env["CONDUIT_FILES_DIR"]) / storage_key).is_file()


def test_create_get_deliver_delete_on_either_backend(
    backend: str,
    files_api: str,
    launcher: Launcher,
    admin: Admin,
    database_url: str,
    s3: S3Server,
) -> None:
    data = secrets.token_bytes(9 * MIB + 7)  # past one 8 MiB part: a multipart upload on s3
    account, token = _account(admin)
    with _client(files_api, token) as client:
        response = client.post(
            "/v1/files",
            files={"content": ("b l.bin", data, "application/x-test")},
            data={"metadata": json.dumps({"backend": backend})},
        )
        assert response.status_code == 201, response.text
        created = response.json()
        assert created["size"] == len(data)
        assert created["checksums"]["sha256"] == hashlib.sha256(data).hexdigest()
        assert created["checksums"]["md5"] == hashlib.md5(data).hexdigest()
        assert created["metadata"] == {"backend": backend}
        assert client.get(f"/v1/files/{created['id']}").json() == created
        assert [f["id"] for f in client.get("/v1/files").json()["results"]] == [created["id"]]
        (row,) = _file_rows(database_url, account)
        assert row["storage_key"].endswith(created["id"]) and row["kind"] == "upload"
        assert _held(backend, launcher, s3, row["storage_key"])

        served = httpx.get(_delivery_url(files_api, created), timeout=60)
        assert served.status_code == 200, served.text[:300]
        assert served.content == data
        assert served.headers["content-type"] == "application/x-test"
        assert served.headers["etag"] == f'"{created["etag"]}"'

        assert client.delete(f"/v1/files/{created['id']}").status_code == 204
        assert_problem(client.get(f"/v1/files/{created['id']}"), 404)
        assert_problem(httpx.get(_delivery_url(files_api, created), timeout=60), 404)
        assert not _held(backend, launcher, s3, row["storage_key"])
        assert _file_rows(database_url, account) == []


def test_the_official_client_runs_with_a_file_kept_in_s3(
    s3_api: str, deployment: str, s3: S3Server, admin: Admin, tmp_path: Path
) -> None:
    data = secrets.token_bytes(3 * MIB + 1)
    path = tmp_path / "photo.png"
    path.write_bytes(data)
    _, token = _account(admin)
    client = Client(api_token=token, base_url=s3_api)
    try:
        with path.open("rb") as handle:
            output = client.run(deployment, input={"file": handle})
        url = str(output)
        assert url.startswith(f"{s3_api}/v1/files/"), url
        assert _bytes_at(url) == data
        (upload,) = client.files.list()
        assert upload.size == len(data)
        keys = _bucket_keys(s3)
        assert any(k.startswith("uploads/") and k.endswith(f"/{upload.id}") for k in keys), keys
        output_id = _file_id(url)
        assert any(k.startswith("outputs/") and k.endswith(f"/{output_id}") for k in keys), keys

        notes = tmp_path / "notes.txt"
        notes.write_bytes(b"kept in a bucket\n")
        created = client.files.create(notes, metadata={"k": "v"})
        assert (created.name, created.content_type, created.size) == ("notes.txt", "text/plain", 17)
        assert created.metadata == {"k": "v"}
        assert client.files.get(created.id).id == created.id
        assert [f.id for f in client.files.list()] == [created.id, upload.id]
        key = next(k for k in _bucket_keys(s3) if k.endswith(f"/{created.id}"))
        assert client.files.delete(created.id) is True
        assert key not in _bucket_keys(s3)
        assert [f.id for f in client.files.list()] == [upload.id]
    finally:
        client._client.close()  # the client never closes its own connection pool


def test_store_down_refuses_uploads_and_fails_outputs_then_the_deployment_goes_on(
    s3: S3Server, s3_api: str, deployment: str, admin: Admin, database_url: str
) -> None:
    account, token = _account(admin)
    predictions = f"/v1/deployments/{deployment}/predictions"
    with _client(s3_api, token) as client:
        s3.stop()
        try:
            refused = client.post(
                "/v1/files", files={"content": ("a.txt", b"x" * 1000, "text/plain")}
            )
            assert assert_problem(refused, 503)["code"] == "store_unavailable"
            assert client.get("/v1/files").json()["results"] == []
            assert _file_rows(database_url, account) == []

            created = create(client, predictions, input={"size": 1000, "seed": 5})
            failed = wait_status(client, created["id"], timeout=120)
            assert failed["status"] == "failed", failed
            assert "output file could not be stored" in (failed["error"] or ""), failed["error"]
            assert failed["output"] is None
            assert _file_rows(database_url, account) == []
        finally:
            s3.restart()  # same port, empty: the bucket is made again
            asyncio.run(s3.create_bucket(BUCKET))

        after = create(client, predictions, input={"size": 1000, "seed": 6})
        done = wait_status(client, after["id"], timeout=120)
        assert done["status"] == "succeeded", done["error"]
        assert _bytes_at(done["output"]) == made_bytes(1000, 6)
        (row,) = _file_rows(database_url, account)
        assert (row["kind"], row["prediction_id"]) == ("output", after["id"])
        assert row["storage_key"] in _bucket_keys(s3)
        taken = client.post("/v1/files", files={"content": ("a.txt", b"back", "text/plain")})
        assert taken.status_code == 201, taken.text
