"""Output files through the director's receiver, over real HTTP on loopback, into a real store
(a directory) and the real ``files`` table: data URLs taken out of streaming webhooks, uploads
on an attempt's own files URL and on stock Cog's upload URL, and what happens when the store
cannot take them."""

from __future__ import annotations

import base64
import io
import random
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from core.ports import free_port
from director.attempts import Attempt, Attempts
from director.leases import Lease
from director.metrics import DirectorMetrics
from director.output_files import OutputStore
from director.queue import Entry
from director.receiver import Receiver
from files.links import FileLinks
from files.service import Files
from files.settings import FileSettings
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.scripted_runner import ScriptedRunner, scripted_runner
from tests.fixtures.waiting import wait_for
from tracker.stream_urls import StreamSigner

API = "http://api.example"
INLINE_MAX = 1024
MAX_BYTES = 64 * 1024 * 1024


@dataclass
class Box:
    receiver: Receiver
    attempts: Attempts
    files: Files
    http: aiohttp.ClientSession
    account_id: int

    def running(self, prediction_id: str | None = None, number: int = 1) -> Attempt:
        prediction_id = prediction_id or f"p{uuid.uuid4().hex[:20]}"
        entry = Entry("input:prediction:{test}:0", f"{uuid.uuid4().int % 10**9}-0", prediction_id)
        attempt = self.attempts.add(entry, Lease(prediction_id))
        attempt.lease.attempt = number
        attempt.account_id = self.account_id
        assert self.attempts.next_to_run() is attempt
        return attempt

    async def stored(self, url: str) -> tuple[Any, bytes]:
        """The record and the bytes a delivery URL names, read back through the store."""
        path = urlsplit(url).path.split("/")  # /v1/files/<id>/<token>/<name>
        record, opened = await self.files.open_delivery(path[3], path[4])
        data = b"".join([chunk async for chunk in opened.chunks])
        return record, data


async def _account(admin: Admin, engine: AsyncEngine) -> int:
    name = f"files-{uuid.uuid4().hex[:8]}"
    admin.create_account(name)
    async with engine.connect() as conn:
        query = sa.text("SELECT id FROM accounts WHERE name = :name")
        return int((await conn.execute(query, {"name": name})).scalar_one())


@asynccontextmanager
async def box(
    engine: AsyncEngine,
    admin: Admin,
    directory: Path,
    upload_token: str | None = None,
    max_bytes: int = MAX_BYTES,
) -> AsyncIterator[Box]:
    settings = FileSettings(dir=directory, inline_max=INLINE_MAX, max_bytes=max_bytes)
    signer = StreamSigner(key=secrets.token_bytes(32))
    files = Files(engine, settings.store(), FileLinks(API, signer), settings)
    attempts = Attempts(4)
    receiver = Receiver(
        "127.0.0.1",
        0,
        None,
        attempts,
        DirectorMetrics(),
        output=OutputStore(files, INLINE_MAX),
        upload_token=upload_token,
    )
    await receiver.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield Box(receiver, attempts, files, http, await _account(admin, engine))
    finally:
        await receiver.stop()


async def _send(
    http: aiohttp.ClientSession, method: str, url: str, data: Any, **kwargs: Any
) -> tuple[int, dict[str, str], bytes]:
    if isinstance(data, bytes):  # sent with its Content-Length
        data = io.BytesIO(data)
    async with http.request(method, url, data=data, **kwargs) as response:
        return response.status, dict(response.headers), await response.read()


def _data_url(data: bytes, mime: str = "image/png") -> bytes:
    return b"data:" + mime.encode() + b";base64," + base64.b64encode(data)


async def test_a_30_mb_data_url_webhook_is_taken_and_its_bytes_stored(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    image = random.Random(7).randbytes(30 * 1024 * 1024)
    small = _data_url(b"tiny", "text/plain").decode()
    async with box(engine, admin, tmp_path) as b:
        attempt = b.running()
        head = orjson.dumps({"id": attempt.prediction_id, "input": {"image": small}})[:-1]
        body = head + b', "status": "succeeded", "output": ["' + _data_url(image) + b'", '
        body += orjson.dumps(small) + b'], "logs": "made \\"data:it\\"\\n"}'

        async def chunks() -> AsyncIterator[bytes]:  # streamed, no Content-Length
            for at in range(0, len(body), 1 << 20):
                yield body[at : at + (1 << 20)]

        url = b.receiver.webhook_url(attempt)
        status, _, _ = await _send(b.http, "POST", url, chunks())
        assert status == 200
        snapshot = attempt.snapshots.get_nowait()
        assert snapshot.input is None  # the input echo is dropped
        assert snapshot.logs == 'made "data:it"\n'
        file_url, inline = snapshot.output
        assert inline == small  # a small one stays inline
        assert file_url.startswith(f"{API}/v1/files/f") and file_url.endswith("/out-1.png")
        record, stored = await b.stored(file_url)
        assert stored == image
        assert (record.kind, record.prediction_id, record.account_id) == (
            "output",
            attempt.prediction_id,
            b.account_id,
        )
        assert (record.content_type, record.size) == ("image/png", len(image))
        assert attempt.unkept is None


async def test_cumulative_webhooks_store_each_output_file_once(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    # Stock Cog without an upload URL repeats an iterator's earlier outputs in every webhook.
    images = [random.Random(seed).randbytes(2 * 1024 * 1024) for seed in range(3)]
    async with box(engine, admin, tmp_path) as b:
        attempt = b.running()
        outputs: list[list[str]] = []
        for count in (1, 2, 3):
            body = b'{"status": "processing", "output": ["'
            body += b'", "'.join(_data_url(image) for image in images[:count]) + b'"]}'
            status, _, _ = await _send(b.http, "POST", b.receiver.webhook_url(attempt), body)
            assert status == 200
            outputs.append(attempt.snapshots.get_nowait().output)
        assert outputs[1][:1] == outputs[0] and outputs[2][:2] == outputs[1]
        assert [(await b.stored(url))[1] for url in outputs[2]] == images
        async with engine.connect() as conn:
            query = sa.text(
                "SELECT count(*) FROM files WHERE prediction_id = :p AND deleted_at IS NULL"
            )
            assert (await conn.execute(query, {"p": attempt.prediction_id})).scalar_one() == 3
        stored = [p for p in tmp_path.rglob("*") if p.is_file() and attempt.prediction_id in str(p)]
        assert len(stored) == 3
        assert attempt.unkept is None


async def test_a_data_url_written_with_json_escapes_is_stored(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    image = random.Random(9).randbytes(5000)
    encoded = base64.b64encode(image).decode()
    lines = "\\n".join(encoded[at : at + 76] for at in range(0, len(encoded), 76))
    payload = lines.replace("/", "\\/")  # as encoders that escape slashes write it
    body = '{"status": "succeeded", "output": "data:image/png;base64,' + payload + '"}'
    async with box(engine, admin, tmp_path) as b:
        attempt = b.running()
        url = b.receiver.webhook_url(attempt)
        assert (await _send(b.http, "POST", url, body.encode()))[0] == 200
        assert (await b.stored(attempt.snapshots.get_nowait().output))[1] == image


async def test_an_attempts_files_url_takes_a_put_and_answers_201_with_its_url(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    async with box(engine, admin, tmp_path) as b:
        attempt = b.running()
        data = random.Random(3).randbytes(3 * 1024 * 1024 + 5)
        url = f"{b.receiver.webhook_url(attempt)}/files/result.wav"
        headers = {"Content-Type": "audio/wav"}
        status, answer, body = await _send(b.http, "PUT", url, data, headers=headers)
        assert status == 201
        location = answer["Location"]
        assert location.endswith("/result.wav") and orjson.loads(body) == {"url": location}
        record, stored = await b.stored(location)
        assert (stored, record.content_type, record.name) == (data, "audio/wav", "result.wav")

        other = b.running()
        forged = [
            f"{b.receiver.public_url}/runner/{attempt.prediction_id}/1/{other.secret}/files/x",
            f"{b.receiver.public_url}/runner/{attempt.prediction_id}/2/{attempt.secret}/files/x",
            f"{b.receiver.public_url}/runner/{attempt.prediction_id}/1/{attempt.secret}/files/",
            f"{b.receiver.public_url}/runner/nobody/1/{attempt.secret}/files/x",
        ]
        answers = [await _send(b.http, "PUT", u, b"forged") for u in forged]
        assert {status for status, _, _ in answers} == {404}
        assert len({body for _, _, body in answers}) == 1


async def test_stock_cogs_upload_needs_an_attempt_in_flight_here(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    async with box(engine, admin, tmp_path) as b:
        attempt = b.running()
        url = f"{b.receiver.public_url}/upload/out.txt"
        mine = {"X-Prediction-ID": attempt.prediction_id, "Content-Type": "text/plain"}
        status, answer, _ = await _send(b.http, "PUT", url, b"hello", headers=mine)
        assert status == 201
        assert (await b.stored(answer["Location"]))[1] == b"hello"

        waiting_id = f"p{uuid.uuid4().hex[:20]}"
        b.attempts.add(Entry("s", "1-0", waiting_id), Lease(waiting_id))  # read, not running
        for headers in ({}, {"X-Prediction-ID": "p-unknown"}, {"X-Prediction-ID": waiting_id}):
            assert (await _send(b.http, "PUT", url, b"x", headers=headers))[0] == 404


async def test_an_upload_token_puts_a_secret_in_the_upload_path(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    async with box(engine, admin, tmp_path, upload_token="t0ken") as b:
        attempt = b.running()
        headers = {"X-Prediction-ID": attempt.prediction_id}
        base = f"{b.receiver.public_url}/upload"
        assert (await _send(b.http, "PUT", f"{base}/out.txt", b"x", headers=headers))[0] == 404
        assert (await _send(b.http, "PUT", f"{base}/wrong/out.txt", b"x", headers=headers))[
            0
        ] == 404
        assert (await _send(b.http, "PUT", f"{base}/t0ken/out.txt", b"x", headers=headers))[
            0
        ] == 201


async def test_an_output_the_store_cannot_take_fails_the_attempt_at_once(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_bytes(b"")  # the store's directory is a file: every write fails
    async with box(engine, admin, blocked) as b:
        attempt = b.running()
        url = f"{b.receiver.webhook_url(attempt)}/files/out.png"
        status, answer, body = await _send(b.http, "PUT", url, b"x" * 10)
        assert status == 503
        assert answer["Content-Type"] == "application/problem+json"
        assert attempt.unkept is not None
        assert attempt.unkept.startswith("output file could not be stored")
        assert attempt.output_lost.is_set()

        webhook_attempt = b.running()
        body = b'{"status": "succeeded", "output": "' + _data_url(b"y" * 5000) + b'"}'
        webhook = b.receiver.webhook_url(webhook_attempt)
        assert (await _send(b.http, "POST", webhook, body))[0] == 503
        assert webhook_attempt.snapshots.empty()
        assert (webhook_attempt.unkept or "").startswith("output file could not be stored")


async def test_a_file_past_the_limit_is_refused_and_fails_the_attempt(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    async with box(engine, admin, tmp_path, max_bytes=4096) as b:
        attempt = b.running()
        url = f"{b.receiver.webhook_url(attempt)}/files/big.bin"
        assert (await _send(b.http, "PUT", url, b"z" * 5000))[0] == 413
        assert "4096" in (attempt.unkept or "")
        assert list(tmp_path.rglob("*.tmp-*")) == []


async def test_a_cog_upload_past_the_limit_is_refused_without_failing_the_attempt(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    # /upload/ takes a prediction's id, no secret: whoever knows the id must not fail it.
    async with box(engine, admin, tmp_path, max_bytes=4096) as b:
        attempt = b.running()
        url = f"{b.receiver.public_url}/upload/big.bin"
        headers = {"X-Prediction-ID": attempt.prediction_id}
        status, answer, _ = await _send(b.http, "PUT", url, b"z" * 5000, headers=headers)
        assert (status, answer["Content-Type"]) == (413, "application/problem+json")
        assert attempt.unkept is None and not attempt.output_lost.is_set()
        assert list(tmp_path.rglob("*.tmp-*")) == []
        status, answer, _ = await _send(b.http, "PUT", url, b"z" * 100, headers=headers)
        assert status == 201


async def test_a_malformed_webhook_is_a_400_and_keeps_the_attempt(
    engine: AsyncEngine, admin: Admin, tmp_path: Path
) -> None:
    async with box(engine, admin, tmp_path) as b:
        attempt = b.running()
        webhook = b.receiver.webhook_url(attempt)
        for body in (b'{"status": "succeeded", "output": [1', b"[]", b'{"output": "x"} tail'):
            status, answer, _ = await _send(b.http, "POST", webhook, body)
            assert (status, answer["Content-Type"]) == (400, "application/problem+json")
        bad = b'{"status": "succeeded", "output": "data:a/b;base64,' + b"A" * 4000 + b'!"}'
        assert (await _send(b.http, "POST", webhook, bad))[0] == 400
        assert attempt.unkept is None and attempt.snapshots.empty()


# --- a real director beside a scripted runner ----------------------------------------------


@dataclass
class Deployed:
    runner: ScriptedRunner
    path: str
    director: Proc
    files: Path


@contextmanager
def _deployed(launcher: Launcher, admin: Admin, files: Path) -> Iterator[Deployed]:
    """A director whose runner holds every prediction (the test speaks for it), storing
    output files in ``files``; data URLs past 1 KiB become files."""
    with scripted_runner(f"files-{uuid.uuid4().hex[:8]}", hold=True) as runner:
        name = f"test/{runner.name}"
        admin.create_model(name, runner.url)
        admin.create_deployment(name, name, shards=1, visibility="public")
        env = {"CONDUIT_FILES_DIR": str(files), "CONDUIT_FILES_INLINE_MAX": str(INLINE_MAX)}
        director = launcher.director(name, runner.url, env=env, receiver_port=str(free_port()))
        try:
            wait_for(lambda: runner.capability_reads > 0, "director up")
            yield Deployed(runner, f"/v1/deployments/{name}/predictions", director, files)
        finally:
            director.stop()


def _handed(deployed: Deployed, prediction_id: str) -> str:
    def url() -> str | None:
        deployed.director.check_alive()
        with deployed.runner.lock:
            held = deployed.runner.held.get(prediction_id)
        return held[0] if held else None

    return wait_for(url, "the director's start to reach the runner", timeout=30)


def test_a_director_stores_a_webhooks_large_output_and_hands_out_its_url(
    client: httpx.Client, launcher: Launcher, admin: Admin, tmp_path: Path
) -> None:
    image = random.Random(11).randbytes(200_000)
    with _deployed(launcher, admin, tmp_path / "files") as deployed:
        prediction_id = create(client, deployed.path, input={"prompt": "draw"})["id"]
        handed = _handed(deployed, prediction_id)
        done = b'{"status": "succeeded", "output": ["' + _data_url(image) + b'"]}'
        assert httpx.post(handed, content=done, timeout=30).status_code == 200
        final = wait_status(client, prediction_id)
        assert final["status"] == "succeeded", final
        [url] = final["output"]
        assert url.endswith("/out-1.png") and "/v1/files/f" in url
        stored = [p for p in deployed.files.rglob("*") if p.is_file()]
        assert [p.read_bytes() for p in stored] == [image]


def test_an_output_the_director_cannot_store_fails_the_prediction_at_once(
    client: httpx.Client, launcher: Launcher, admin: Admin, tmp_path: Path
) -> None:
    """No waiting for the deployment's 30-minute timeout: the prediction fails with the
    reason, and the runner's slot is free for the next one."""
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"")
    with _deployed(launcher, admin, blocked) as deployed:
        prediction_id = create(client, deployed.path, input={"prompt": "lost"})["id"]
        handed = _handed(deployed, prediction_id)
        done = b'{"status": "succeeded", "output": "' + _data_url(b"q" * 5000) + b'"}'
        assert httpx.post(handed, content=done, timeout=30).status_code == 503
        final = wait_status(client, prediction_id)
        assert final["status"] == "failed"
        assert final["error"].startswith("output file could not be stored"), final["error"]
        following = create(client, deployed.path, input={"prompt": "next"})["id"]
        _handed(deployed, following)  # concurrency 1: the slot was freed
