"""Files in and out, end to end: the unmodified official clients, a stock Cog model (cog 0.23.1)
with a ``Path`` input and a ``Path`` output, and Conduit's file store.

One Cog server is started with ``--upload-url`` pointing at its director's receiver (the output
is PUT there and stored); another without it, so its outputs arrive as data URLs inside the
terminal webhook, which the receiver reads as a stream and moves into the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import replicate
from replicate.exceptions import ReplicateError
from replicate.helpers import FileOutput

from core.ports import free_port
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, fetch, wait_status
from tests.fixtures.cog_server import FIXTURES, cog_server
from tests.fixtures.js_client import needs_node, scenarios
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e

MODEL_DIR = FIXTURES / "cog_file_model"
UPLOADING = "test/cog-files"
INLINE = "test/cog-files-inline"
MIB = 1024 * 1024


def made_bytes(size: int, seed: int) -> bytes:
    """What the fixture model makes for ``size`` and ``seed`` (1 MiB draws, as it writes)."""
    rng = random.Random(seed)
    parts, left = [], size
    while left > 0:
        n = min(MIB, left)
        parts.append(rng.randbytes(n))
        left -= n
    return b"".join(parts)


def _deploy(
    launcher: Launcher, admin: Admin, logdir: Path, name: str, upload: bool
) -> Iterator[str]:
    receiver_port = free_port()
    args = ["--upload-url", f"http://127.0.0.1:{receiver_port}/upload/"] if upload else []
    with cog_server(MODEL_DIR, logdir, *args) as url:
        admin.create_model(name, url)
        admin.create_deployment(name, name, shards=1, visibility="public")
        director = launcher.director(name, url, concurrency=1, receiver_port=str(receiver_port))
        try:
            yield name
        finally:
            director.stop()


# ``stack`` first: the directors must render URLs against the session's api.
@pytest.fixture(scope="module")
def uploading(
    stack: Stack, launcher: Launcher, admin: Admin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    yield from _deploy(launcher, admin, tmp_path_factory.mktemp("cog-up"), UPLOADING, True)


@pytest.fixture(scope="module")
def inline(
    stack: Stack, launcher: Launcher, admin: Admin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    yield from _deploy(launcher, admin, tmp_path_factory.mktemp("cog-in"), INLINE, False)


@pytest.fixture
def official(stack: Stack, token: str) -> Iterator[replicate.Client]:
    client = replicate.Client(api_token=token, base_url=stack.api_url)
    yield client
    client._client.close()  # the client never closes its own connection pool


@pytest.fixture
def other_client(stack: Stack, admin: Admin) -> Iterator[httpx.Client]:
    """Another account's client."""
    other = admin.create_account(f"other-{uuid.uuid4().hex[:10]}")
    headers = {"Authorization": f"Bearer {other}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as http:
        yield http


def _bytes_at(url: str) -> httpx.Response:
    """The output URL fetched as anyone would: no token, no redirect followed."""
    answer = httpx.get(url, timeout=60, follow_redirects=False)
    assert answer.status_code == 200, (answer.status_code, answer.text[:300])
    return answer


def test_a_local_file_reaches_the_model_intact(
    official: replicate.Client, uploading: str, tmp_path: Path
) -> None:
    data = made_bytes(20 * MIB, seed=7)
    path = tmp_path / "photo.png"
    path.write_bytes(data)
    with path.open("rb") as handle:
        output = official.run(uploading, input={"file": handle})
    url = str(output)
    assert url.startswith("http"), output
    answer = _bytes_at(url)
    assert hashlib.sha256(answer.content).hexdigest() == hashlib.sha256(data).hexdigest()
    assert answer.headers["content-type"].startswith("image/png")
    # What the client's FileOutput does with such a URL (it wraps https: ones itself).
    assert FileOutput(url, official).read() == data


def test_a_field_the_model_does_not_declare_is_refused_naming_it(
    official: replicate.Client, uploading: str, client: httpx.Client, tmp_path: Path
) -> None:
    """Cog drops an input field its model does not declare, and so did Replicate: the run
    would succeed without it (``image`` for the model's ``file``: an empty output). The api
    refuses it instead, naming the field and the model's inputs, on every way in."""
    path = tmp_path / "photo.png"
    path.write_bytes(b"not really a png")
    with path.open("rb") as handle, pytest.raises(ReplicateError) as refused:
        official.run(uploading, input={"image": handle})
    assert refused.value.status == 422, refused.value
    detail = str(refused.value.detail)
    assert "input.image" in detail and "its inputs: file, " in detail, detail

    body = {"input": {"image": "data:image/png;base64,AAAA", "seed": 1}}
    created = assert_problem(
        client.post(f"/v1/deployments/{uploading}/predictions", json=body), 422
    )
    assert [e["field"] for e in created["errors"]] == ["input.image"]
    assert client.get("/v1/predictions").json()["results"] == []  # nothing was created

    def run() -> httpx.Response | None:  # once the lane's fleet view has the runner
        response = client.post(f"/v1/deployments/{uploading}/run", json=body)
        return None if response.status_code == 429 else response

    ran = assert_problem(wait_for(run, "the lane's answer"), 422)
    assert [e["field"] for e in ran["errors"]] == ["input.image"]


def test_async_run_and_create_with_a_file_handle(
    official: replicate.Client, uploading: str, tmp_path: Path
) -> None:
    data = made_bytes(MIB + 3, seed=8)
    path = tmp_path / "clip.wav"
    path.write_bytes(data)

    async def run() -> object:
        try:
            with path.open("rb") as handle:
                return await official.async_run(uploading, input={"file": handle})
        finally:
            await official._async_client.aclose()  # bound to this event loop

    assert _bytes_at(str(asyncio.run(run()))).content == data
    with path.open("rb") as handle:
        prediction = official.deployments.predictions.create(uploading, input={"file": handle})
    prediction.wait()
    assert prediction.status == "succeeded", prediction.error
    assert _bytes_at(str(prediction.output)).content == data


@pytest.mark.parametrize("size", [5 * MIB, 30 * MIB])
def test_big_outputs_are_urls_and_the_deployment_goes_on(
    client: httpx.Client, uploading: str, size: int
) -> None:
    path = f"/v1/deployments/{uploading}/predictions"
    created = create(client, path, input={"size": size, "seed": size % 97})
    done = wait_status(client, created["id"], timeout=120)
    assert done["status"] == "succeeded", done["error"]
    assert _bytes_at(done["output"]).content == made_bytes(size, size % 97)
    assert len(client.get(f"/v1/predictions/{created['id']}").content) < 64 * 1024
    assert len(client.get("/v1/predictions").content) < MIB
    after = create(client, path, input={"size": 10, "seed": 1})
    assert wait_status(client, after["id"], timeout=60)["status"] == "succeeded"


def test_data_url_outputs_are_moved_into_the_store(client: httpx.Client, inline: str) -> None:
    path = f"/v1/deployments/{inline}/predictions"
    big = create(client, path, input={"size": 30 * MIB, "seed": 3, "suffix": ".bin"})
    done = wait_status(client, big["id"], timeout=120)
    assert done["status"] == "succeeded", done["error"]
    assert done["output"].startswith("http"), done["output"][:100]
    answer = _bytes_at(done["output"])
    assert answer.content == made_bytes(30 * MIB, 3)
    assert len(client.get(f"/v1/predictions/{big['id']}").content) < 64 * 1024
    # Small outputs stay inline, as Replicate's sync answers keep them.
    small = create(client, path, input={"size": 1000, "seed": 4, "suffix": ".txt"})
    kept = wait_status(client, small["id"], timeout=60)
    assert kept["output"].startswith("data:text/plain;base64,"), kept["output"][:60]


def test_another_accounts_file_is_refused_and_nothing_is_stored(
    client: httpx.Client, other_client: httpx.Client, uploading: str
) -> None:
    upload = other_client.post(
        "/v1/files", files={"content": ("x.txt", b"theirs", "text/plain")}
    ).json()
    answer = client.post(
        f"/v1/deployments/{uploading}/predictions",
        json={"input": {"file": upload["urls"]["get"]}},
    )
    assert answer.status_code == 422, answer.text
    assert "input.file" in answer.text
    mine = client.post("/v1/files", files={"content": ("m.txt", b"mine", "text/plain")}).json()
    created = create(
        client, f"/v1/deployments/{uploading}/predictions", input={"file": mine["urls"]["get"]}
    )
    done = wait_status(client, created["id"], timeout=60)
    assert done["status"] == "succeeded", done["error"]
    assert fetch(client, created["id"])["input"] == {"file": mine["urls"]["get"]}
    assert _bytes_at(done["output"]).content == b"mine"


@needs_node
def test_js_client_runs_with_a_buffer(stack: Stack, token: str, uploading: str) -> None:
    seen = scenarios(stack.api_url, token)("runWithBuffer", model=uploading, size=3 * MIB, seed=5)
    assert seen["same"] and seen["size"] == 3 * MIB, seen
    uploads = [r for r in seen["requests"] if r["method"] == "POST" and "/v1/files" in r["url"]]
    assert len(uploads) == 1 and uploads[0]["authorization"]


@needs_node
def test_js_client_files_api(stack: Stack, token: str) -> None:
    seen = scenarios(stack.api_url, token)(
        "filesRoundTrip", text="hello js", metadata={"purpose": "test"}
    )
    created = seen["created"]
    assert created["size"] == len("hello js") and created["metadata"] == {"purpose": "test"}
    assert created["checksums"]["sha256"] == hashlib.sha256(b"hello js").hexdigest()
    assert seen["got"]["id"] == created["id"] == seen["listedFirst"]
    assert created["id"] in seen["ids"]
    assert seen["afterDelete"] == 404
