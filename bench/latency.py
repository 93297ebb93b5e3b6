"""Latency of Conduit against calling the runner directly, on a throwaway local stack.

``.venv/bin/python -m bench.latency`` (or ``python bench/latency.py``) from the repo root:

1. ``Prefer: wait`` on echo (n=1, delay=0): sequential ``POST .../predictions`` through the api
   and director, against sequential synchronous ``PUT /predictions/<id>`` to the same runner.
2. Runner output → client: a stamped echo (n=50, delay=0.02) whose chunks carry their
   production time; each chunk's age on arrival over Conduit's SSE stream, against its age on
   arrival at a webhook receiver the same runner calls directly.

See bench/README.md for what each figure includes and the results measured so far.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import BenchStack, running_stack
from bench.stamped_runner import produced_at
from conduit.runtime import run_async
from core.ports import free_port
from tests.fixtures.processes import RUNNER_AUTH

ECHO = "bench/echo"
STAMPED = "bench/stamped"
WAIT_INPUT = {"prompt": "bench", "n": 1, "delay": 0}
CHUNKS = 50
DELAY = 0.02
STREAM_INPUT = {"prompt": "s", "n": CHUNKS, "delay": DELAY}
ALL_EVENTS = ["start", "output", "logs", "completed"]
TARGET_MS = 5.0
RUN_TIMEOUT = 30.0


@dataclass(frozen=True)
class Options:
    requests: int
    warmup: int
    streams: int


def ms(seconds: float) -> float:
    return seconds * 1000


def percentiles(samples: Sequence[float]) -> tuple[float, float, float, float]:
    """p50, p90, p99 (linear interpolation between closest ranks) and max."""
    if len(samples) < 2:
        return (samples[0],) * 4
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[89], cuts[98], max(samples)


def table(title: str, rows: Sequence[tuple[str, Sequence[float]]]) -> str:
    width = max(len(name) for name, _ in rows) + 2
    lines = [title, f"{'':<{width}}{'n':>6}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}  (ms)"]
    for name, samples in rows:
        p50, p90, p99, top = percentiles(samples)
        figures = "".join(f"{value:>9.2f}" for value in (p50, p90, p99, top))
        lines.append(f"{name:<{width}}{len(samples):>6}{figures}")
    return "\n".join(lines)


# 1. Prefer: wait against a synchronous PUT to the runner


async def direct_sync(http: httpx.AsyncClient, runner_url: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        url = f"{runner_url}/predictions/bench-{uuid.uuid4().hex}"
        start = time.perf_counter()
        response = await http.put(url, json={"input": WAIT_INPUT}, headers=RUNNER_AUTH)
        times.append(ms(time.perf_counter() - start))
        body = response.json()
        if response.status_code != 200 or body["status"] != "succeeded":
            raise RuntimeError(f"runner answered {response.status_code}: {response.text}")
    return times


@dataclass
class WaitSamples:
    total: list[float] = field(default_factory=list)
    #: Segments between the client's clock and the row's Postgres timestamps, in order.
    segments: dict[str, list[float]] = field(default_factory=dict)

    def add_segments(self, sent: float, body: dict[str, Any], received: float) -> None:
        stamps = [sent] + [
            datetime.fromisoformat(body[key]).timestamp()
            for key in ("created_at", "started_at", "completed_at")
        ]
        stamps.append(received)
        names = (
            "send → created_at (row inserted)",
            "created_at → started_at (processing)",
            "started_at → completed_at (terminal)",
            "completed_at → response received",
        )
        for name, begin, end in zip(names, stamps, stamps[1:], strict=False):
            self.segments.setdefault(name, []).append(ms(end - begin))


async def conduit_wait(
    http: httpx.AsyncClient, api_url: str, token: str, count: int
) -> WaitSamples:
    url = f"{api_url}/v1/deployments/{ECHO}/predictions"
    headers = {"Authorization": f"Bearer {token}", "Prefer": "wait"}
    samples = WaitSamples()
    for _ in range(count):
        sent = time.time()
        start = time.perf_counter()
        response = await http.post(url, json={"input": WAIT_INPUT}, headers=headers)
        samples.total.append(ms(time.perf_counter() - start))
        received = time.time()
        body = response.json()
        if response.status_code != 201 or body["status"] != "succeeded":
            raise RuntimeError(f"api answered {response.status_code}: {response.text}")
        samples.add_segments(sent, body, received)
    return samples


# 2. Runner output → client receipt


@dataclass
class Collector:
    """Chunks of one direct prediction as its webhooks deliver them."""

    latencies: list[float] = field(default_factory=list)
    first_produced: float | None = None
    seen: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self, body: dict[str, Any], at: float) -> None:
        output = body.get("output") or []
        for chunk in output[self.seen :]:
            produced = produced_at(chunk)
            if self.first_produced is None:
                self.first_produced = produced
            self.latencies.append(ms(at - produced))
        self.seen = max(self.seen, len(output))
        if body.get("status") in ("succeeded", "failed", "canceled"):
            self.done.set()


class WebhookTap:
    """An aiohttp receiver in this process that the runner posts its webhooks to."""

    def __init__(self) -> None:
        self.port = free_port()
        self.collectors: dict[str, Collector] = {}
        app = web.Application()
        app.router.add_post("/hook/{id}", self._hook)
        self._runner = web.AppRunner(app, access_log=None)

    def url(self, prediction_id: str) -> str:
        return f"http://127.0.0.1:{self.port}/hook/{prediction_id}"

    async def start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _hook(self, request: web.Request) -> web.Response:
        at = time.monotonic()
        collector = self.collectors.get(request.match_info["id"])
        if collector is not None:
            collector.take(await request.json(), at)
        return web.json_response({})


@dataclass
class StreamSamples:
    latencies: list[float] = field(default_factory=list)
    #: Request sent → the model started (first chunk's stamp minus its delay).
    to_start: list[float] = field(default_factory=list)
    #: Chunks produced before the SSE response opened (replayed history, not measured).
    replayed: int = 0


async def direct_stream(
    http: httpx.AsyncClient, runner_url: str, tap: WebhookTap, samples: StreamSamples
) -> None:
    prediction_id = f"bench-{uuid.uuid4().hex}"
    collector = tap.collectors[prediction_id] = Collector()
    body = {
        "input": STREAM_INPUT,
        "webhook": tap.url(prediction_id),
        "webhook_events_filter": ALL_EVENTS,
    }
    sent = time.monotonic()
    url = f"{runner_url}/predictions/{prediction_id}"
    response = await http.put(url, json=body, headers={"Prefer": "respond-async", **RUNNER_AUTH})
    if response.status_code != 202:
        raise RuntimeError(f"runner answered {response.status_code}: {response.text}")
    async with asyncio.timeout(RUN_TIMEOUT):
        await collector.done.wait()
    del tap.collectors[prediction_id]
    if collector.seen != CHUNKS or collector.first_produced is None:
        raise RuntimeError(f"direct stream delivered {collector.seen} of {CHUNKS} chunks")
    samples.latencies += collector.latencies
    samples.to_start.append(ms(collector.first_produced - DELAY - sent))


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, str, float]]:
    """(event, data, monotonic receipt time) for each event of an SSE response."""
    event, data = "message", list[str]()
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event, "\n".join(data), time.monotonic()
            event, data = "message", []
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)


async def conduit_stream(
    http: httpx.AsyncClient, api_url: str, token: str, samples: StreamSamples
) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    sent = time.monotonic()
    created = await http.post(
        f"{api_url}/v1/deployments/{STAMPED}/predictions",
        json={"input": STREAM_INPUT},
        headers=auth,
    )
    if created.status_code != 201:
        raise RuntimeError(f"api answered {created.status_code}: {created.text}")
    url = f"{api_url}/v1/predictions/{created.json()['id']}/stream"
    chunks = 0
    async with (
        asyncio.timeout(RUN_TIMEOUT),
        http.stream("GET", url, headers={**auth, "Accept": "text/event-stream"}) as response,
    ):
        opened = time.monotonic()
        async for event, data, at in sse_events(response):
            if event == "done":
                break
            if event != "output":
                continue
            produced = produced_at(data)
            if chunks == 0:
                samples.to_start.append(ms(produced - DELAY - sent))
            chunks += 1
            if produced < opened:
                samples.replayed += 1
            else:
                samples.latencies.append(ms(at - produced))
    if chunks != CHUNKS:
        raise RuntimeError(f"SSE delivered {chunks} of {CHUNKS} chunks")


# Running it all


@dataclass(frozen=True)
class Endpoints:
    api_url: str
    token: str
    echo_runner: str
    stamped_runner: str


@dataclass
class Results:
    direct: list[float]
    conduit: WaitSamples
    direct_stream: StreamSamples
    conduit_stream: StreamSamples


async def measure(endpoints: Endpoints, options: Options) -> Results:
    limits = httpx.Limits(max_keepalive_connections=4)
    async with httpx.AsyncClient(timeout=RUN_TIMEOUT + 40, limits=limits) as http:
        await direct_sync(http, endpoints.echo_runner, options.warmup)
        direct = await direct_sync(http, endpoints.echo_runner, options.requests)
        await conduit_wait(http, endpoints.api_url, endpoints.token, options.warmup)
        conduit = await conduit_wait(http, endpoints.api_url, endpoints.token, options.requests)

        tap = WebhookTap()
        await tap.start()
        try:
            direct_streamed, conduit_streamed = StreamSamples(), StreamSamples()
            await direct_stream(http, endpoints.stamped_runner, tap, StreamSamples())  # warm-up
            await conduit_stream(http, endpoints.api_url, endpoints.token, StreamSamples())
            for _ in range(options.streams):  # interleaved, so drift hits both alike
                await direct_stream(http, endpoints.stamped_runner, tap, direct_streamed)
                await conduit_stream(http, endpoints.api_url, endpoints.token, conduit_streamed)
        finally:
            await tap.stop()
    return Results(direct, conduit, direct_streamed, conduit_streamed)


def start(stack: BenchStack) -> Endpoints:
    echo_runner = stack.runner()
    stack.deploy(ECHO, echo_runner)
    stamped_runner = stack.stamped_runner()
    stack.deploy(STAMPED, stamped_runner)
    return Endpoints(stack.api(), stack.token(), echo_runner, stamped_runner)


def report(results: Results, options: Options) -> str:
    machine = f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
    head = f"Conduit latency benchmark ({machine}, Python {platform.python_version()})"
    wait = table(
        f"\n1. Prefer: wait on echo {WAIT_INPUT}: {options.requests} sequential requests "
        f"after {options.warmup} warm-up",
        [
            ("direct: PUT /predictions/<id> to the runner", results.direct),
            ("Conduit: POST Prefer: wait via api+director", results.conduit.total),
        ],
    )
    gap = percentiles(results.conduit.total)[0] - percentiles(results.direct)[0]
    verdict = "met" if gap <= TARGET_MS else "NOT met"
    wait += f"\np50 difference: {gap:+.2f} ms (target +{TARGET_MS:g} ms: {verdict})"
    segments = table(
        "\nWhere Conduit's time goes (client wall clock vs the row's Postgres timestamps)",
        list(results.conduit.segments.items()),
    )
    ds, cs = results.direct_stream, results.conduit_stream
    stream = table(
        f"\n2. Runner output → client, stamped echo {STREAM_INPUT}, {options.streams} "
        "predictions each, interleaved",
        [
            ("direct: runner webhook → bench receiver", ds.latencies),
            ("Conduit: runner → director → Redis → api SSE", cs.latencies),
            ("direct: PUT sent → model started", ds.to_start),
            ("Conduit: POST sent → model started", cs.to_start),
        ],
    )
    stream += f"\nchunks produced before the SSE response opened (not measured): {cs.replayed}"
    return "\n".join([head, wait, segments, stream])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="timed Prefer: wait requests")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests first")
    parser.add_argument("--streams", type=int, default=10, help="timed streams per path")
    args = parser.parse_args()
    options = Options(args.requests, args.warmup, args.streams)
    began = time.monotonic()
    with running_stack() as stack:
        endpoints = start(stack)
        results = run_async(measure(endpoints, options))
    print(report(results, options))
    print(f"\ntotal run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
