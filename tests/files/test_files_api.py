"""The files API over a real api process: uploads in both official clients' shapes, reading,
paging, deleting, delivery URLs, the limits, and file references in a prediction's input."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest
import replicate

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.processes import Launcher
from tracker.stream_urls import StreamSigner

#: The own api's file limit and page size: small, so that tests cross them cheaply.
MAX_BYTES = 64 * 1024
PAGE_SIZE = 2
SIGNING_KEY = secrets.token_urlsafe(32)
MISSING_ID = "f" + "a" * 25


@dataclass(frozen=True)
class OwnApi:
    url: str

    def client(self, token: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def own_api(stack: Stack, launcher: Launcher) -> Iterator[OwnApi]:
    """An api with a small file limit, small pages and a known signing key."""
    env = {
        "CONDUIT_FILES_MAX_BYTES": str(MAX_BYTES),
        "CONDUIT_API_PAGE_SIZE": str(PAGE_SIZE),
        "CONDUIT_STREAM_SIGNING_KEY": SIGNING_KEY,
    }
    with launcher.own_api(env) as url:
        yield OwnApi(url)


def _upload(
    client: httpx.Client,
    data: bytes,
    name: str = "hello.txt",
    content_type: str = "text/plain",
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An upload as the Python client sends it: metadata as a text field."""
    form = {"metadata": json.dumps(metadata)} if metadata is not None else {}
    response = client.post("/v1/files", files={"content": (name, data, content_type)}, data=form)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def _delivery_url(
    api_url: str, file: dict[str, Any], exp: int = 0, name: str = "", key: str = SIGNING_KEY
) -> str:
    sig = StreamSigner(key=key.encode()).sign("file", file["id"], exp)
    return f"{api_url}/v1/files/{file['id']}/{exp}.{sig}/{quote(name or file['name'], safe='')}"


def test_upload_in_the_python_clients_shape_is_answered_and_read_back(
    client: httpx.Client,
) -> None:
    data = b"hello, files\n" * 1000
    created = _upload(client, data, metadata={"purpose": "test", "n": 1})
    assert created["id"].startswith("f") and len(created["id"]) == 26
    assert created["name"] == "hello.txt"
    assert created["content_type"] == "text/plain"
    assert created["size"] == len(data)
    assert created["checksums"] == {
        "sha256": hashlib.sha256(data).hexdigest(),
        "md5": hashlib.md5(data).hexdigest(),
    }
    assert created["etag"]
    assert created["metadata"] == {"purpose": "test", "n": 1}
    assert created["created_at"] and created["expires_at"] > created["created_at"]
    assert created["urls"]["get"] == f"{client.base_url}/v1/files/{created['id']}"
    fetched = client.get(f"/v1/files/{created['id']}")
    assert fetched.status_code == 200
    assert fetched.json() == created


def test_upload_in_the_js_clients_shape_takes_its_metadata_part(client: httpx.Client) -> None:
    data = secrets.token_bytes(5000)
    parts = [
        ("content", ("pixel.png", data, "image/png")),
        ("metadata", ("blob", json.dumps({"from": "js"}).encode(), "application/json")),
    ]
    response = client.post("/v1/files", files=parts)
    assert response.status_code == 201, response.text
    created = response.json()
    assert (created["name"], created["content_type"], created["size"]) == (
        "pixel.png",
        "image/png",
        len(data),
    )
    assert created["metadata"] == {"from": "js"}


def test_a_body_without_content_or_with_bad_metadata_names_the_field(
    client: httpx.Client,
) -> None:
    missing = client.post("/v1/files", files={"other": ("a.txt", b"x", "text/plain")})
    assert assert_problem(missing, 422)["errors"][0]["field"] == "content"
    bad = client.post(
        "/v1/files", files={"content": ("a.txt", b"x", "text/plain")}, data={"metadata": "{"}
    )
    assert assert_problem(bad, 422)["errors"][0]["field"] == "metadata"
    listed = client.get("/v1/files").json()
    assert listed["results"] == []


def test_metadata_is_bounded_across_parts_and_storable(client: httpx.Client) -> None:
    """Many metadata parts add up to one bound (64 KiB), and a NUL (which Postgres' JSONB
    refuses) is the client's error, not the server's."""
    parts: list[tuple[str, tuple[str | None, bytes, str]]] = [
        ("content", ("a.txt", b"x", "text/plain"))
    ]
    for i in range(40):  # 40 parts of 4 KiB each: every one fine, all together not
        blob = orjson.dumps({f"k{i}": "v" * 4000})
        parts.append(("metadata", (None, blob, "application/json")))
    too_much = client.post("/v1/files", files=parts)
    assert assert_problem(too_much, 413)["errors"][0]["field"] == "metadata"
    nul = client.post(
        "/v1/files",
        files={"content": ("a.txt", b"x", "text/plain")},
        data={"metadata": '{"note": "a\\u0000b"}'},
    )
    assert assert_problem(nul, 422)["errors"][0]["field"] == "metadata"
    assert client.get("/v1/files").json()["results"] == []


def test_list_pages_newest_first(own_api: OwnApi, admin: Admin) -> None:
    with own_api.client(admin.create_account(f"files-{uuid.uuid4().hex[:8]}")) as client:
        ids = [_upload(client, f"file {i}".encode())["id"] for i in range(5)]
        seen: list[str] = []
        page = client.get("/v1/files").json()
        pages = [page]
        while True:
            assert len(page["results"]) <= PAGE_SIZE
            seen += [f["id"] for f in page["results"]]
            if page["next"] is None:
                break
            page = client.get(page["next"]).json()
            pages.append(page)
        assert seen == ids[::-1]
        back = client.get(pages[-1]["previous"]).json()
        assert back["results"] == pages[-2]["results"]


def test_delete_removes_the_file(client: httpx.Client) -> None:
    created = _upload(client, b"gone soon")
    assert client.delete(f"/v1/files/{created['id']}").status_code == 204
    assert_problem(client.get(f"/v1/files/{created['id']}"), 404)
    assert_problem(client.delete(f"/v1/files/{created['id']}"), 404)
    assert created["id"] not in [f["id"] for f in client.get("/v1/files").json()["results"]]


def test_another_accounts_file_is_as_absent_as_a_missing_one(
    client: httpx.Client, stack: Stack, admin: Admin
) -> None:
    created = _upload(client, b"mine")
    other_token = admin.create_account(f"files-other-{uuid.uuid4().hex[:8]}")
    with httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {other_token}"}, timeout=30
    ) as other:
        for method in ("GET", "DELETE"):
            hidden = other.request(method, f"/v1/files/{created['id']}")
            absent = other.request(method, f"/v1/files/{MISSING_ID}")
            assert_problem(hidden, 404)
            assert hidden.text.replace(created["id"], MISSING_ID) == absent.text
        assert other.get("/v1/files").json()["results"] == []
    assert client.get(f"/v1/files/{created['id']}").status_code == 200


def test_delivery_url_serves_the_bytes_without_a_token(own_api: OwnApi, admin: Admin) -> None:
    data = secrets.token_bytes(MAX_BYTES - 100)
    with own_api.client(admin.create_account(f"files-{uuid.uuid4().hex[:8]}")) as client:
        created = _upload(client, data, name="a b.bin", content_type="application/x-test")
    url = _delivery_url(own_api.url, created)
    served = httpx.get(url)
    assert served.status_code == 200
    assert served.content == data
    assert served.headers["content-type"] == "application/x-test"
    assert served.headers["content-length"] == str(len(data))
    assert served.headers["etag"] == f'"{created["etag"]}"'
    assert served.headers["cache-control"] == "private"
    assert served.headers["content-disposition"].startswith("inline")
    # Someone's bytes on the api's origin: never sniffed, never a live document.
    assert served.headers["x-content-type-options"] == "nosniff"
    assert served.headers["content-security-policy"].startswith("sandbox")
    forged = httpx.get(_delivery_url(own_api.url, created, key=secrets.token_urlsafe(32)))
    absent = httpx.get(_delivery_url(own_api.url, {"id": MISSING_ID, "name": "a b.bin"}))
    assert_problem(forged, 404)
    assert_problem(absent, 404)
    assert_problem(httpx.get(_delivery_url(own_api.url, created, name="other.bin")), 404)
    expired = httpx.get(_delivery_url(own_api.url, created, exp=int(time.time()) - 10))
    assert assert_problem(expired, 403)["code"] == "expired_signature"


def test_an_upload_above_the_limit_is_refused_and_not_kept(own_api: OwnApi, admin: Admin) -> None:
    with own_api.client(admin.create_account(f"files-{uuid.uuid4().hex[:8]}")) as client:
        response = client.post(
            "/v1/files", files={"content": ("big.bin", b"x" * (MAX_BYTES + 1), "text/plain")}
        )
        assert assert_problem(response, 413)["errors"][0]["field"] == "content"
        assert client.get("/v1/files").json()["results"] == []
        _upload(client, b"x" * MAX_BYTES)  # at the limit: taken


def test_an_upload_above_the_api_body_limit_is_taken(client: httpx.Client) -> None:
    """Uploads are held to the files' limit (100 MiB), not the api's body limit (10 MiB)."""
    data = secrets.token_bytes(11 * 1024 * 1024)
    created = _upload(client, data, name="big.bin", content_type="application/octet-stream")
    assert created["size"] == len(data)
    assert created["checksums"]["sha256"] == hashlib.sha256(data).hexdigest()


def test_store_down_is_503_with_nothing_recorded(
    launcher: Launcher, admin: Admin, tmp_path: Path
) -> None:
    not_a_dir = tmp_path / "files"
    not_a_dir.write_bytes(b"")  # the store's directory is a file: nothing can be written
    with launcher.own_api({"CONDUIT_FILES_DIR": str(not_a_dir)}) as url:
        token = admin.create_account(f"files-{uuid.uuid4().hex[:8]}")
        with OwnApi(url).client(token) as client:
            response = client.post("/v1/files", files={"content": ("a.txt", b"x", "text/plain")})
            assert assert_problem(response, 503)["code"] == "store_unavailable"
            assert client.get("/v1/files").json()["results"] == []


def test_the_official_python_client(stack: Stack, token: str, tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"from the client\n")
    client = replicate.Client(api_token=token, base_url=stack.api_url)
    try:
        created = client.files.create(path, metadata={"k": "v"})
        assert (created.name, created.content_type, created.size) == (
            "notes.txt",
            "text/plain",
            16,
        )
        assert created.metadata == {"k": "v"}
        assert created.checksums["sha256"] == hashlib.sha256(b"from the client\n").hexdigest()
        assert client.files.get(created.id).id == created.id
        assert [f.id for f in client.files.list()] == [created.id]
        assert client.files.delete(created.id) is True
        assert client.files.list() == []
    finally:
        client._client.close()


def test_a_prediction_may_refer_only_to_its_accounts_files(
    client: httpx.Client, stack: Stack, admin: Admin
) -> None:
    other_token = admin.create_account(f"files-other-{uuid.uuid4().hex[:8]}")
    with httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {other_token}"}, timeout=30
    ) as other:
        theirs = _upload(other, b"not yours")
    path = f"/v1/deployments/{ECHO}/predictions"
    refused = client.post(path, json={"input": {"prompt": theirs["urls"]["get"]}})
    body = assert_problem(refused, 422)
    assert body["errors"] == [{"field": "input.prompt", "message": "file not found"}]
    assert client.get("/v1/predictions").json()["results"] == []
    mine = _upload(client, b"yours")
    taken = client.post(path, json={"input": {"prompt": mine["urls"]["get"]}})
    assert taken.status_code == 201, taken.text
    assert taken.json()["input"] == {"prompt": mine["urls"]["get"]}
