"""What one account may store, over a real api process: its rate of uploads, the count and
bytes of its live uploads (nothing kept past them, uploads side by side included), a body read
no further than its closing boundary, and a content type that could not be served refused."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.processes import Launcher

KIB = 1024
MAX_FILES = 3
MAX_BYTES = 100 * KIB
#: Uploads an account may make a minute (all at once): more than any other test here makes.
RATE = 5
EPILOGUE = 64 * 1024 * KIB


@dataclass(frozen=True)
class QuotaApi:
    url: str
    files_dir: Path
    admin: Admin

    def client(self) -> httpx.Client:
        token = self.admin.create_account(f"quota-{uuid.uuid4().hex[:8]}")
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stored(self) -> list[Path]:
        """Every file the store holds, finished or half-written."""
        return [path for path in self.files_dir.rglob("*") if path.is_file()]


@pytest.fixture(scope="module")
def quota_api(
    stack: Stack, launcher: Launcher, admin: Admin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[QuotaApi]:
    """An api with small quotas and its own file store (so what it holds can be counted)."""
    files_dir = tmp_path_factory.mktemp("quota-files")
    env = {
        "CONDUIT_FILES_DIR": str(files_dir),
        "CONDUIT_FILES_ACCOUNT_MAX_FILES": str(MAX_FILES),
        "CONDUIT_FILES_ACCOUNT_MAX_BYTES": str(MAX_BYTES),
        "CONDUIT_FILES_UPLOAD_RATE_LIMIT": f"{RATE}req/min",
        "CONDUIT_FILES_UPLOAD_RATE_BURST": str(RATE),
    }
    with launcher.own_api(env) as url:
        yield QuotaApi(url, files_dir, admin)


def _post(client: httpx.Client, data: bytes, content_type: str = "text/plain") -> httpx.Response:
    return client.post("/v1/files", files={"content": ("a.txt", data, content_type)})


def _listed(client: httpx.Client) -> list[dict[str, Any]]:
    response = client.get("/v1/files")
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def test_uploads_past_the_accounts_rate_get_429_with_retry_after(quota_api: QuotaApi) -> None:
    with quota_api.client() as client, quota_api.client() as other:
        for _ in range(RATE):
            created = _post(client, b"x")
            assert created.status_code == 201
            # A deleted upload gives no rate back (nor does the quota refuse here).
            assert client.delete(f"/v1/files/{created.json()['id']}").status_code == 204
        refused = _post(client, b"x")
        problem = assert_problem(refused, 429)
        assert problem["code"] == "rate_limited"
        assert "files uploaded" in problem["detail"]
        assert int(refused.headers["retry-after"]) >= 1
        assert _listed(client) == []
        assert _post(other, b"x").status_code == 201  # per account


def test_the_count_of_live_files_is_bounded(quota_api: QuotaApi) -> None:
    with quota_api.client() as client:
        for _ in range(MAX_FILES):
            assert _post(client, b"x").status_code == 201
        problem = assert_problem(_post(client, b"x"), 403)
        assert problem["code"] == "file_quota"
        assert "CONDUIT_FILES_ACCOUNT_MAX_FILES" in problem["detail"]
        assert len(_listed(client)) == MAX_FILES
        assert client.delete(f"/v1/files/{_listed(client)[0]['id']}").status_code == 204
        assert _post(client, b"x").status_code == 201  # a deleted file stops counting


def test_bytes_past_the_quota_are_refused_and_nothing_is_kept(quota_api: QuotaApi) -> None:
    with quota_api.client() as client:
        assert _post(client, b"a" * (60 * KIB)).status_code == 201
        before = quota_api.stored()
        # Its size known only once read (no Content-Length): the store stops at the room left.
        chunked = client.post(
            "/v1/files",
            content=iter([_form(b"b" * (60 * KIB))]),
            headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY.decode()}"},
        )
        problem = assert_problem(chunked, 413)
        assert problem["code"] == "file_quota"
        assert "CONDUIT_FILES_ACCOUNT_MAX_BYTES" in problem["detail"]
        assert [f["size"] for f in _listed(client)] == [60 * KIB]
        assert quota_api.stored() == before
        assert _post(client, b"c" * (40 * KIB)).status_code == 201  # what is left still fits


def test_uploads_side_by_side_cannot_pass_the_quota_together(quota_api: QuotaApi) -> None:
    with quota_api.client() as client:
        before = set(quota_api.stored())
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: _post(client, b"z" * (45 * KIB)), range(3)))
        codes = sorted(response.status_code for response in answers)
        assert codes == [201, 201, 413], [response.text for response in answers]
        assert sum(f["size"] for f in _listed(client)) == 90 * KIB
        kept = set(quota_api.stored()) - before
        assert sorted(path.stat().st_size for path in kept) == [45 * KIB] * 2  # not the third


BOUNDARY = b"quota-boundary"


def _form(data: bytes, content_type: bytes = b"text/plain") -> bytes:
    return (
        b"--" + BOUNDARY + b"\r\n"
        b'Content-Disposition: form-data; name="content"; filename="a.txt"\r\n'
        b"Content-Type: " + content_type + b"\r\n\r\n" + data + b"\r\n--" + BOUNDARY + b"--\r\n"
    )


def test_nothing_after_the_closing_boundary_is_read(quota_api: QuotaApi) -> None:
    """A body that declares 64 MiB of epilogue gets its answer before sending any of it, and
    the connection is closed: the api never waits for (or reads) what follows."""
    with quota_api.client() as client:
        token = client.headers["Authorization"]
        form = _form(b"hello")
        address = urlsplit(quota_api.url)
        head = (
            f"POST /v1/files HTTP/1.1\r\nHost: {address.netloc}\r\n"
            f"Authorization: {token}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY.decode()}\r\n"
            f"Content-Length: {len(form) + EPILOGUE}\r\n\r\n"
        ).encode()
        with socket.create_connection((address.hostname, address.port), timeout=20) as sock:
            sock.sendall(head + form)
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            status, _, rest = answer.partition(b"\r\n")
            assert status.startswith(b"HTTP/1.1 201"), answer
            assert b"connection: close" in rest.lower()
            while sock.recv(65536):  # then the api closes: no more of the body is taken
                pass
        [created] = _listed(client)
        assert created["size"] == len(b"hello")


def test_a_content_type_with_cr_or_lf_is_422_naming_it(quota_api: QuotaApi) -> None:
    with quota_api.client() as client:
        # A bare LF or another control character inside the part's header is kept by the
        # parser; served back as a header, it would make the file undeliverable.
        for bad in (b"text/plain\n; charset=utf-8", b"text/plain\x0b; a=b", b"a/b\x7f"):
            response = client.post(
                "/v1/files",
                content=_form(b"x", content_type=bad),
                headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY.decode()}"},
            )
            problem = assert_problem(response, 422)
            assert problem["errors"][0]["field"] == "content_type", problem
        assert _listed(client) == []
