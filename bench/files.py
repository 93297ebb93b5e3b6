"""Files in and out on a throwaway local stack, for both file stores (a local directory, and
S3 as spoken by ``moto_server`` on loopback).

``.venv/bin/python -m bench.files`` from the repo root. For each backend, in one run:

1. **Upload**: ``POST /v1/files`` of a 50 MiB file (multipart, streamed by httpx from a
   generator of 256 KiB chunks, with its ``Content-Length``), against the same bytes put
   straight into the store from the bench process (``FileStore.put``, same generator).
2. **Download**: ``GET`` of the upload's delivery URL (no token), against ``FileStore.open``
   of the same object read to its end.
3. **A 30 MiB output end to end**: a stock Cog model (``tests/fixtures/cog_file_model``,
   coglet) served with ``--upload-url`` to its director's receiver, and another without it
   (the output comes as a data URL in the terminal webhook and is moved into the store).
   Create with ``Prefer: wait`` (polling after, if needed) → ``succeeded``, against the
   model's own ``metrics.predict_time``.
4. **api memory**: ``VmRSS`` of the api process, sampled every 50 ms from ``/proc``, before,
   during and after 10 concurrent 50 MiB uploads.

Throughputs are MB/s (10^6 bytes); figures are ``median (min–max)`` over the repeats, ratios
are Conduit over the direct store path measured in the same repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from redis.asyncio import Redis

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Repeated, machine, table
from bench.stack import BenchStack, running_stack
from conduit.runtime import run_async
from core.ports import free_port
from files.settings import FileSettings
from files.store import FileStore
from tests.fixtures.cog_server import FIXTURES, cog_server
from tests.fixtures.processes import Proc
from tests.fixtures.s3_server import ACCESS_KEY, REGION, SECRET_KEY, s3_server
from tracker.stream_urls import StreamUrlSettings

MIB = 1024 * 1024
CHUNK = 256 * 1024
MODEL_DIR = FIXTURES / "cog_file_model"
BUCKET = "conduit-bench"
BACKENDS = ("local", "s3")


@dataclass(frozen=True)
class Options:
    repeats: int
    upload_mib: int
    output_mib: int
    concurrent: int


@dataclass
class Figures:
    """One backend's figures, each across the repeats."""

    upload: Repeated = field(default_factory=Repeated)
    upload_direct: Repeated = field(default_factory=Repeated)
    upload_ratio: Repeated = field(default_factory=Repeated)
    download: Repeated = field(default_factory=Repeated)
    download_direct: Repeated = field(default_factory=Repeated)
    download_ratio: Repeated = field(default_factory=Repeated)
    #: "upload" and "inline" (data URL): client time, the model's predict_time, overhead (s).
    e2e: dict[str, tuple[Repeated, Repeated, Repeated]] = field(default_factory=dict)
    rss_before: Repeated = field(default_factory=Repeated)
    rss_peak: Repeated = field(default_factory=Repeated)
    rss_after: Repeated = field(default_factory=Repeated)
    rss_growth: Repeated = field(default_factory=Repeated)
    concurrent_rate: Repeated = field(default_factory=Repeated)


# The payload, streamed


def chunks_of(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), CHUNK):
        yield bytes(view[start : start + CHUNK])


async def achunks(data: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks_of(data):
        yield chunk


class Multipart:
    """A ``multipart/form-data`` body with one file part ``content``, as the official clients
    send it, streamed from ``data`` in chunks."""

    def __init__(self, data: bytes, name: str, content_type: str) -> None:
        self.data = data
        self.boundary = uuid.uuid4().hex
        self.head = (
            f"--{self.boundary}\r\n"
            f'Content-Disposition: form-data; name="content"; filename="{name}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n"
        ).encode()
        self.tail = f"\r\n--{self.boundary}--\r\n".encode()

    @property
    def headers(self) -> dict[str, str]:
        return {
            "Content-Type": f"multipart/form-data; boundary={self.boundary}",
            "Content-Length": str(len(self.head) + len(self.data) + len(self.tail)),
        }

    async def body(self) -> AsyncIterator[bytes]:
        yield self.head
        async for chunk in achunks(self.data):
            yield chunk
        yield self.tail


def mb_per_s(size: int, seconds: float) -> float:
    return size / seconds / 1e6


# 1 and 2. Upload and download


@dataclass
class Client:
    http: httpx.AsyncClient
    api_url: str
    token: str
    store: FileStore
    stack: BenchStack
    redis: Redis

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def upload(self, data: bytes, name: str = "bench.bin") -> dict[str, Any]:
        form = Multipart(data, name, "application/octet-stream")
        answer = await self.http.post(
            f"{self.api_url}/v1/files",
            content=form.body(),
            headers={**self.auth, **form.headers},
        )
        if answer.status_code != 201:
            raise RuntimeError(f"upload answered {answer.status_code}: {answer.text[:300]}")
        body: dict[str, Any] = answer.json()
        if body["size"] != len(data):
            raise RuntimeError(f"upload stored {body['size']} bytes of {len(data)}")
        return body

    async def delete(self, file_id: str) -> None:
        answer = await self.http.delete(f"{self.api_url}/v1/files/{file_id}", headers=self.auth)
        if answer.status_code != 204:
            raise RuntimeError(f"delete answered {answer.status_code}: {answer.text[:300]}")

    async def delivery_url(self, file: dict[str, Any]) -> str:
        """The upload's delivery URL (``files.links``), signed with the stack's key."""
        signer = StreamUrlSettings().signer(self.redis)
        await signer.load()
        sig = signer.sign("file", file["id"], 0)
        return f"{self.api_url}/v1/files/{file['id']}/0.{sig}/{quote(file['name'], safe='')}"

    def storage_key(self, file_id: str) -> str:
        rows = self.stack.query("SELECT storage_key FROM files WHERE id = %s", (file_id,))
        return str(rows[0][0])


async def timed_upload(client: Client, data: bytes) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    file = await client.upload(data)
    return time.perf_counter() - start, file


async def timed_put(store: FileStore, key: str, data: bytes) -> float:
    start = time.perf_counter()
    stored = await store.put(
        key, achunks(data), content_type="application/octet-stream", max_bytes=len(data)
    )
    elapsed = time.perf_counter() - start
    if stored.size != len(data):
        raise RuntimeError(f"store put kept {stored.size} bytes of {len(data)}")
    return elapsed


async def timed_get(http: httpx.AsyncClient, url: str, size: int) -> float:
    start = time.perf_counter()
    got = 0
    async with http.stream("GET", url) as answer:
        if answer.status_code != 200:
            await answer.aread()
            raise RuntimeError(f"delivery answered {answer.status_code}: {answer.text[:300]}")
        async for chunk in answer.aiter_raw():
            got += len(chunk)
    elapsed = time.perf_counter() - start
    if got != size:
        raise RuntimeError(f"delivery gave {got} bytes of {size}")
    return elapsed


async def timed_open(store: FileStore, key: str, size: int) -> float:
    start = time.perf_counter()
    opened = await store.open(key)
    got = 0
    async for chunk in opened.chunks:
        got += len(chunk)
    elapsed = time.perf_counter() - start
    if got != size:
        raise RuntimeError(f"store open gave {got} bytes of {size}")
    return elapsed


async def transfer(client: Client, data: bytes, figures: Figures) -> None:
    """One repeat of 1 and 2: Conduit and the direct store path, one after the other."""
    size = len(data)
    up_s, file = await timed_upload(client, data)
    key = f"bench/{uuid.uuid4().hex}"
    direct_up_s = await timed_put(client.store, key, data)
    figures.upload.add(mb_per_s(size, up_s))
    figures.upload_direct.add(mb_per_s(size, direct_up_s))
    figures.upload_ratio.add(direct_up_s / up_s)

    url = await client.delivery_url(file)
    down_s = await timed_get(client.http, url, size)
    direct_down_s = await timed_open(client.store, client.storage_key(file["id"]), size)
    figures.download.add(mb_per_s(size, down_s))
    figures.download_direct.add(mb_per_s(size, direct_down_s))
    figures.download_ratio.add(direct_down_s / down_s)

    await client.delete(file["id"])
    await client.store.delete(key)


# 3. A big output end to end


async def end_to_end(client: Client, deployment: str, size: int, seed: int) -> tuple[float, float]:
    """Create → succeeded (client's clock) and the model's ``predict_time``, in seconds."""
    path = f"{client.api_url}/v1/deployments/{deployment}/predictions"
    body = {"input": {"size": size, "seed": seed, "suffix": ".bin"}}
    start = time.perf_counter()
    answer = await client.http.post(path, json=body, headers={**client.auth, "Prefer": "wait"})
    if answer.status_code not in (200, 201):
        raise RuntimeError(f"create answered {answer.status_code}: {answer.text[:300]}")
    prediction = answer.json()
    while prediction["status"] not in ("succeeded", "failed", "canceled"):
        await asyncio.sleep(0.05)
        polled = await client.http.get(
            f"{client.api_url}/v1/predictions/{prediction['id']}", headers=client.auth
        )
        prediction = polled.json()
    elapsed = time.perf_counter() - start
    if prediction["status"] != "succeeded":
        raise RuntimeError(f"{deployment}: {prediction['status']}: {prediction.get('error')}")
    output = prediction["output"]
    if not (isinstance(output, str) and output.startswith("http")):
        raise RuntimeError(f"{deployment}: output is not a URL: {str(output)[:100]}")
    return elapsed, float(prediction["metrics"]["predict_time"])


# 4. api memory under concurrent uploads


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Sampler:
    """VmRSS of one process every ``interval`` seconds, on a thread of its own (the bench's
    event loop is busy sending)."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(rss_bytes(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def settled_rss(pid: int, seconds: float = 1.0) -> int:
    """The api's RSS after ``seconds`` of sampling while idle (the last sample)."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(rss_bytes(pid))
        await asyncio.sleep(0.05)
    return samples[-1]


async def memory(client: Client, pid: int, data: bytes, count: int, figures: Figures) -> None:
    before = await settled_rss(pid)
    start = time.perf_counter()
    with Sampler(pid) as sampler:
        files = await asyncio.gather(*(client.upload(data) for _ in range(count)))
    elapsed = time.perf_counter() - start
    after = await settled_rss(pid)
    peak = max([before, *sampler.samples])
    figures.rss_before.add(before / MIB)
    figures.rss_peak.add(peak / MIB)
    figures.rss_after.add(after / MIB)
    figures.rss_growth.add((peak - before) / MIB)
    figures.concurrent_rate.add(mb_per_s(count * len(data), elapsed))
    for file in files:
        await client.delete(file["id"])


# One backend


@dataclass
class Deployed:
    api_url: str
    api_pid: int
    store: FileStore
    deployments: dict[str, str]  # "upload" / "inline" -> deployment name


def files_env(backend: str, endpoint_url: str | None) -> dict[str, str]:
    if backend == "local":
        return {"CONDUIT_FILES_BACKEND": "local"}
    assert endpoint_url is not None
    return {
        "CONDUIT_FILES_BACKEND": "s3",
        "CONDUIT_FILES_S3_BUCKET": BUCKET,
        "CONDUIT_FILES_S3_ENDPOINT_URL": endpoint_url,
        "CONDUIT_FILES_S3_REGION": REGION,
        "CONDUIT_FILES_S3_ACCESS_KEY_ID": ACCESS_KEY,
        "CONDUIT_FILES_S3_SECRET_ACCESS_KEY": SECRET_KEY,
    }


def bench_store(backend: str, stack: BenchStack, endpoint_url: str | None) -> FileStore:
    """The same store the api and directors use, opened in the bench process."""
    if backend == "local":
        return FileSettings(
            backend="local", dir=Path(stack.launcher.env["CONDUIT_FILES_DIR"])
        ).store()
    return FileSettings(
        backend="s3",
        s3_bucket=BUCKET,
        s3_endpoint_url=endpoint_url,
        s3_region=REGION,
        s3_access_key_id=ACCESS_KEY,
        s3_secret_access_key=SECRET_KEY,
    ).store()


@contextmanager
def deployed(stack: BenchStack, backend: str, logdir: Path) -> Iterator[Deployed]:
    """An api and two Cog deployments (with and without ``--upload-url``) on ``backend``;
    all of it stopped when the block ends."""
    logdir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stop:
        endpoint_url = None
        if backend == "s3":
            server = stop.enter_context(s3_server(logdir))
            asyncio.run(server.create_bucket(BUCKET))
            endpoint_url = server.endpoint_url
        env = files_env(backend, endpoint_url)
        procs: list[Proc] = []

        def stop_procs() -> None:
            for proc in reversed(procs):
                proc.stop()

        stop.callback(stop_procs)
        api, api_url = stack.launcher.api(env)
        procs.append(api)
        assert api.popen is not None
        deployments = {}
        for kind in ("upload", "inline"):
            receiver_port = free_port()
            args = ["--upload-url", f"http://127.0.0.1:{receiver_port}/upload/"]
            url = stop.enter_context(
                cog_server(MODEL_DIR, logdir, *(args if kind == "upload" else []))
            )
            name = f"bench/cog-{kind}-{backend}"
            stack.admin.create_model(name, url)
            stack.admin.create_deployment(name, name, shards=1, visibility="public")
            director = stack.launcher.director(
                name,
                url,
                concurrency=1,
                env={**env, "CONDUIT_PUBLIC_URL": api_url},
                receiver_port=str(receiver_port),
                retry_interval="5",
            )
            procs.append(director)
            deployments[kind] = name
        yield Deployed(
            api_url, api.popen.pid, bench_store(backend, stack, endpoint_url), deployments
        )


async def measure(stack: BenchStack, where: Deployed, token: str, options: Options) -> Figures:
    figures = Figures()
    data = os.urandom(options.upload_mib * MIB)
    redis = Redis.from_url(stack.redis_url)
    limits = httpx.Limits(max_connections=options.concurrent + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        client = Client(http, where.api_url, token, where.store, stack, redis)
        try:
            # Warm-up: a small upload and download each way, a small prediction per deployment.
            small = await client.upload(data[:MIB])
            await timed_get(http, await client.delivery_url(small), MIB)
            await client.delete(small["id"])
            key = f"bench/{uuid.uuid4().hex}"
            await timed_put(client.store, key, data[:MIB])
            await timed_open(client.store, key, MIB)
            await client.store.delete(key)
            for name in where.deployments.values():
                await end_to_end(client, name, MIB, 0)
            for _ in range(options.repeats):
                await transfer(client, data, figures)
            for kind, name in where.deployments.items():
                total, model, overhead = figures.e2e.setdefault(
                    kind, (Repeated(), Repeated(), Repeated())
                )
                for i in range(options.repeats):
                    elapsed, predict_time = await end_to_end(
                        client, name, options.output_mib * MIB, i + 1
                    )
                    total.add(elapsed)
                    model.add(predict_time)
                    overhead.add(elapsed - predict_time)
            for _ in range(options.repeats):
                await memory(client, where.api_pid, data, options.concurrent, figures)
        finally:
            await where.store.close()
            await redis.aclose()
    return figures


# Report


def report(results: dict[str, Figures], options: Options) -> str:
    size = f"{options.upload_mib} MiB"
    lines = [
        f"1–2. Upload and download of {size} (MB/s; ratio: Conduit's MB/s over the direct "
        f"store path's in the same repeat), {options.repeats} repeats",
        table(
            ["", *BACKENDS],
            [
                [name, *(getattr(results[b], attr).cell(digits) for b in BACKENDS)]
                for name, attr, digits in (
                    ("POST /v1/files", "upload", 0),
                    ("store put (direct)", "upload_direct", 0),
                    ("upload ratio", "upload_ratio", 2),
                    ("GET delivery URL", "download", 0),
                    ("store open (direct)", "download_direct", 0),
                    ("download ratio", "download_ratio", 2),
                )
            ],
        ),
        "",
        f"3. A {options.output_mib} MiB output of a stock Cog model, create (Prefer: wait) → "
        f"succeeded (s), {options.repeats} repeats",
    ]
    rows = []
    for kind, label in (("upload", "--upload-url"), ("inline", "data URL")):
        for index, what in enumerate(("create → succeeded", "model predict_time", "overhead")):
            rows.append(
                [f"{label}: {what}", *(results[b].e2e[kind][index].cell(2) for b in BACKENDS)]
            )
    lines += [
        table(["", *BACKENDS], rows),
        "",
        f"4. api VmRSS (MiB, sampled every 50 ms) around {options.concurrent} concurrent "
        f"{size} uploads, {options.repeats} repeats",
        table(
            ["", *BACKENDS],
            [
                [name, *(getattr(results[b], attr).cell(digits) for b in BACKENDS)]
                for name, attr, digits in (
                    ("before", "rss_before", 1),
                    ("peak during", "rss_peak", 1),
                    ("after", "rss_after", 1),
                    ("growth (peak - before)", "rss_growth", 1),
                    ("aggregate upload MB/s", "concurrent_rate", 0),
                )
            ],
        ),
        "",
        machine(),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.files", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every figure")
    parser.add_argument("--upload-mib", type=int, default=50, help="size of an upload (MiB)")
    parser.add_argument("--output-mib", type=int, default=30, help="size of the output (MiB)")
    parser.add_argument("--concurrent", type=int, default=10, help="uploads at once in 4.")
    args = parser.parse_args()
    options = Options(args.repeats, args.upload_mib, args.output_mib, args.concurrent)
    began = time.monotonic()
    results: dict[str, Figures] = {}
    with running_stack() as stack:
        token = stack.token()
        for backend in BACKENDS:
            with deployed(stack, backend, stack.launcher.logdir / backend) as where:
                results[backend] = run_async(measure(stack, where, token, options))
    print(report(results, options))
    print(f"\ntotal run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
