"""File inputs and outputs of Conduit's own runner, as a real process serving ``files``.

Outputs that are files are uploaded to the request's ``output_file_prefix`` (the answer's
``Location``, query stripped, becomes the output) or, without one, sent as data URLs; file
inputs given as URLs reach the model as local files, byte for byte.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from runners.models.files import made_bytes

DEADLINE = 60.0
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


@dataclass
class Received:
    path: str
    content_type: str
    body: bytes


@dataclass
class FileServer:
    """Takes uploads (201 + a Location with a query; 500 under ``/broken/``) and serves
    ``inputs`` by name."""

    base_url: str = ""
    uploads: list[Received] = field(default_factory=list)
    inputs: dict[str, bytes] = field(default_factory=dict)
    served: list[str] = field(default_factory=list)

    async def gzipped(self, request: web.Request) -> web.Response:
        """Answers gzip whatever the request accepts."""
        self.served.append(request.path)
        body = gzip.compress(self.inputs[request.match_info["name"]])
        return web.Response(body=body, headers={"Content-Encoding": "gzip"})

    async def upload(self, request: web.Request) -> web.Response:
        body = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            body.extend(chunk)
        self.uploads.append(Received(request.path, request.content_type, bytes(body)))
        if request.path.startswith("/broken/"):
            return web.Response(status=500, text="store down")
        location = f"http://files.test/stored/{request.match_info['name']}?token=secret"
        return web.Response(status=201, headers={"Location": location})

    async def serve(self, request: web.Request) -> web.Response:
        self.served.append(request.path)
        content = self.inputs.get(request.match_info["name"])
        if content is None:
            raise web.HTTPNotFound()
        return web.Response(body=content)


@pytest.fixture
async def files() -> AsyncIterator[FileServer]:
    server_state = FileServer()
    app = web.Application()
    app.router.add_put("/{kind}/{secret}/{name}", server_state.upload)
    app.router.add_get("/inputs/{name}", server_state.serve)
    app.router.add_get("/gzip/{name}", server_state.gzipped)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    server_state.base_url = f"http://127.0.0.1:{server.port}"
    yield server_state
    await server.close()


@dataclass
class RunnerProcess:
    url: str
    tmp: Path


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[RunnerProcess]:
    """``python -m runners files`` with a temporary directory of its own, to see it emptied."""
    async with start_runner(tmp_path, {}) as process:
        yield process


@asynccontextmanager
async def start_runner(tmp_path: Path, extra: dict[str, str]) -> AsyncIterator[RunnerProcess]:
    tmp = tmp_path / "runner-tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), **extra}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "runners", "files", "--host", "127.0.0.1", "--port", "0"),
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stderr is not None
    said = ""

    async def listening() -> str:
        nonlocal said
        assert proc.stderr is not None
        while not ("is ready" in said and (found := LISTENING.search(said))):
            line = await proc.stderr.readline()
            assert line, f"runner exited: {said}"
            said += line.decode()
        return found.group(1)

    try:
        port = await asyncio.wait_for(listening(), DEADLINE)
        drain = asyncio.create_task(_drain(proc.stderr))
        yield RunnerProcess(f"http://127.0.0.1:{port}", tmp)
    finally:
        proc.kill()
        await proc.wait()
    await drain


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def predict(runner: RunnerProcess, body: dict[str, Any]) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=DEADLINE)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(f"{runner.url}/predictions", json=body) as answer,
    ):
        assert answer.status == 200, await answer.text()
        result: dict[str, Any] = await answer.json()
        return result


def made(size: int, seed: int) -> bytes:
    return b"".join(made_bytes(size, seed))


async def test_output_file_is_uploaded_to_the_prefix(
    runner: RunnerProcess, files: FileServer
) -> None:
    size = 3 * 1024 * 1024 + 17  # several chunks
    done = await predict(
        runner,
        {
            "input": {"size": size, "seed": 7, "suffix": ".png"},
            "output_file_prefix": f"{files.base_url}/uploads/s3cr3t/",
        },
    )
    assert done["status"] == "succeeded", done
    assert done["output"] == "http://files.test/stored/out.png"
    [upload] = files.uploads
    assert upload.path == "/uploads/s3cr3t/out.png"
    assert upload.content_type == "image/png"
    assert upload.body == made(size, 7)


async def test_output_file_without_prefix_is_a_data_url(runner: RunnerProcess) -> None:
    done = await predict(runner, {"input": {"size": 100_000, "seed": 3, "suffix": ".txt"}})
    assert done["status"] == "succeeded", done
    head, _, encoded = done["output"].partition(",")
    assert head == "data:text/plain;base64"
    assert base64.b64decode(encoded) == made(100_000, 3)


async def test_file_input_reaches_the_model_intact(
    runner: RunnerProcess, files: FileServer
) -> None:
    content = made(20 * 1024 * 1024, 11)
    files.inputs["photo.jpg"] = content
    done = await predict(
        runner,
        {
            "input": {"file": f"{files.base_url}/inputs/photo.jpg"},
            "output_file_prefix": f"{files.base_url}/uploads/k/",
        },
    )
    assert done["status"] == "succeeded", done
    assert done["output"] == "http://files.test/stored/photo.jpg"
    assert f"sha256={hashlib.sha256(content).hexdigest()}" in done["logs"]
    [upload] = files.uploads
    assert upload.content_type == "image/jpeg"
    assert upload.body == content
    assert list(runner.tmp.iterdir()) == []  # the prediction's files are gone with it


async def test_data_url_input_reaches_the_model(runner: RunnerProcess) -> None:
    content = b"hello, file"
    url = "data:text/plain;base64," + base64.b64encode(content).decode()
    done = await predict(runner, {"input": {"file": url}})
    assert done["status"] == "succeeded", done
    assert done["output"] == url


async def test_failed_upload_fails_the_prediction(runner: RunnerProcess, files: FileServer) -> None:
    done = await predict(
        runner,
        {
            "input": {"size": 10, "suffix": ".bin"},
            "output_file_prefix": f"{files.base_url}/broken/s3cr3t/",
        },
    )
    assert done["status"] == "failed", done
    assert done["error"] == "upload of output file out.bin answered 500"
    assert "s3cr3t" not in done["error"]
    assert "output" not in done


async def test_missing_file_input_fails_the_prediction(
    runner: RunnerProcess, files: FileServer
) -> None:
    done = await predict(runner, {"input": {"file": f"{files.base_url}/inputs/missing.png"}})
    assert done["status"] == "failed", done
    assert done["error"] == "input file: download answered 404"


async def test_a_gzipped_download_is_refused(runner: RunnerProcess, files: FileServer) -> None:
    files.inputs["photo.png"] = made(4096, 5)
    done = await predict(runner, {"input": {"file": f"{files.base_url}/gzip/photo.png"}})
    assert files.served == ["/gzip/photo.png"]
    assert done["status"] == "failed", done
    assert done["error"] == "input file: download is encoded (gzip)"


@pytest.fixture
async def guarded_runner(tmp_path: Path) -> AsyncIterator[RunnerProcess]:
    """A runner whose SSRF guard lets it reach one private network, not loopback."""
    async with start_runner(tmp_path, {"CONDUIT_RUNNER_WEBHOOK_ALLOW": "10.9.9.0/24"}) as process:
        yield process


async def test_a_file_input_at_an_address_the_guard_refuses_is_not_fetched(
    guarded_runner: RunnerProcess, files: FileServer
) -> None:
    files.inputs["photo.jpg"] = b"internal"
    done = await predict(guarded_runner, {"input": {"file": f"{files.base_url}/inputs/photo.jpg"}})
    assert done["status"] == "failed", done
    assert (
        done["error"] == "input file: download refused: address 127.0.0.1 is not publicly routable"
    )
    metadata = await predict(
        guarded_runner, {"input": {"file": "http://169.254.169.254/latest/meta-data/x"}}
    )
    assert metadata["error"] == (
        "input file: download refused: address 169.254.169.254 is not publicly routable"
    )
    assert files.served == []


async def test_an_upload_to_an_address_the_guard_refuses_is_not_sent(
    guarded_runner: RunnerProcess, files: FileServer
) -> None:
    done = await predict(
        guarded_runner,
        {
            "input": {"size": 10, "suffix": ".bin"},
            "output_file_prefix": f"{files.base_url}/uploads/s3cr3t/",
        },
    )
    assert done["status"] == "failed", done
    assert done["error"] == (
        "upload of output file out.bin refused: address 127.0.0.1 is not publicly routable"
    )
    assert files.uploads == []
