"""The runner client against a real loopback server: refusals and their ``Retry-After``, the
runner's capabilities (and a stock Cog's lack of them), and the start backoff's waits."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.backoff import StartBackoff
from director.runner_monitor import RunnerMonitor
from protocol.answers import parse_retry_after
from protocol.capabilities import STOCK_COG, Capabilities
from protocol.client import RunnerClient
from protocol.errors import (
    InputRejected,
    RateLimited,
    RunnerBusy,
    RunnerError,
    RunnerNotReady,
    RunnerRefused,
    RunnerSaturated,
)

Answer = Callable[[], web.Response]


@dataclass
class Loopback:
    """What the loopback runner answers next, and what it was asked."""

    put: Answer = field(default=lambda: web.json_response({"status": "starting"}, status=202))
    capabilities: Answer = field(default=lambda: web.json_response({}, status=404))
    healthy: bool = True
    headers: list[dict[str, str]] = field(default_factory=list)
    capability_reads: int = 0


@pytest.fixture
async def loopback() -> AsyncIterator[tuple[Loopback, RunnerClient]]:
    state = Loopback()

    async def put(request: web.Request) -> web.Response:
        state.headers.append(dict(request.headers))
        return state.put()

    async def capabilities(request: web.Request) -> web.Response:
        state.capability_reads += 1
        return state.capabilities()

    async def health(request: web.Request) -> web.Response:
        if not state.healthy:
            return web.json_response({}, status=503)
        return web.json_response({"status": "READY", "setup": {"started_at": "t0"}})

    app = web.Application()
    app.router.add_put("/predictions/{id}", put)
    app.router.add_get("/v1/capabilities", capabilities)
    app.router.add_get("/health-check", health)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield state, RunnerClient(str(server.make_url("/")), session)
    await server.close()


def _problem(status: int, **headers: str) -> Answer:
    body = {"type": "about:blank", "title": "Refused", "status": status, "detail": "no"}
    return lambda: web.json_response(
        body, status=status, headers=headers, content_type="application/problem+json"
    )


def _cog(status: int, **headers: str) -> Answer:
    return lambda: web.json_response(
        {"error": "Setup has not finished yet.", "status": "failed"}, status=status, headers=headers
    )


def _spec_queue_full(**headers: str) -> Answer:
    """The runner API spec's 503, as a runner that is not Conduit's may send it."""
    error = {"code": "queue_full", "message": "Queue depth 16/16", "queueDepth": 16}
    return lambda: web.json_response({"error": error}, status=503, headers=headers)


async def _refusal(client: RunnerClient) -> RunnerRefused:
    with pytest.raises(RunnerRefused) as raised:
        await client.start("p1", {}, "http://127.0.0.1:1/hook", tenant="7", priority="low")
    return raised.value


async def test_each_refusal_is_told_apart(loopback: tuple[Loopback, RunnerClient]) -> None:
    state, client = loopback
    cases: list[tuple[Answer, type[RunnerRefused], float | None]] = [
        (_cog(409), RunnerBusy, None),
        (_problem(503, **{"Retry-After": "3"}), RunnerSaturated, 3.0),
        (_spec_queue_full(**{"Retry-After": "5"}), RunnerSaturated, 5.0),
        (_cog(503), RunnerNotReady, None),
        (_cog(503, **{"Retry-After": "2"}), RunnerNotReady, 2.0),
        (_problem(429, **{"Retry-After": "1", "X-RateLimit-Remaining": "0"}), RateLimited, 1.0),
    ]
    for answer, kind, retry_after in cases:
        state.put = answer
        refusal = await _refusal(client)
        assert type(refusal) is kind
        assert refusal.retry_after == retry_after
    # Every attempt said whose it is and how urgent.
    assert {(h["X-Tenant-ID"], h["X-Priority"]) for h in state.headers} == {("7", "low")}
    assert {RunnerBusy.reason, RunnerSaturated.reason, RateLimited.reason} == {
        "busy",
        "saturated",
        "rate_limited",
    }


async def test_acceptance_input_errors_and_breakage(
    loopback: tuple[Loopback, RunnerClient],
) -> None:
    state, client = loopback
    await client.start("p1", {}, "http://127.0.0.1:1/hook")  # 202: accepted (maybe queued)
    state.put = lambda: web.json_response({"detail": []}, status=422)
    with pytest.raises(InputRejected):
        await client.start("p1", {}, "http://127.0.0.1:1/hook")
    state.put = lambda: web.json_response({}, status=500)
    with pytest.raises(RunnerError) as raised:
        await client.start("p1", {}, "http://127.0.0.1:1/hook")
    assert not isinstance(raised.value, RunnerRefused)  # broken, not merely busy


def test_retry_after_forms() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("5", now) == 5.0
    assert parse_retry_after(" 0.5 ", now) == 0.5
    assert parse_retry_after("0", now) == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 7, usegmt=True), now) == 7.0
    assert parse_retry_after(email.utils.formatdate(now - 60, usegmt=True), now) == 0.0
    for unreadable in (None, "", "soon", "nan", "Mon, 99 Foo 2024 00:00:00 GMT"):
        assert parse_retry_after(unreadable, now) is None
    assert parse_retry_after("-3", now) == 0.0


async def test_capabilities_of_conduit_and_stock_runners(
    loopback: tuple[Loopback, RunnerClient],
) -> None:
    state, client = loopback
    assert await client.capabilities() == STOCK_COG  # 404: a stock Cog server
    assert STOCK_COG.hardware == "runner"
    body = {"runnerType": "conduit-echo", "runnerId": "r1", "hardware": "cpu", "queue": {}}
    state.capabilities = lambda: web.json_response(body)
    assert await client.capabilities() == Capabilities("conduit-echo", "r1", "cpu")
    # A runner that follows the spec without Conduit's additions: its GPU ids tell, if any.
    spec = {"runnerType": "vllm-0.6.0", "runnerId": "r2", "resources": {"gpuIds": [0]}}
    state.capabilities = lambda: web.json_response(spec)
    assert await client.capabilities() == Capabilities("vllm-0.6.0", "r2", "gpu")
    spec = {"runnerType": "whisper", "health": "healthy"}  # says nothing of its resources
    state.capabilities = lambda: web.json_response(spec)
    assert await client.capabilities() == Capabilities("whisper", None, "runner")
    state.capabilities = lambda: web.json_response({}, status=503)  # still starting
    assert await client.capabilities() is None
    state.capabilities = lambda: web.Response(text="not json", status=200)
    assert await client.capabilities() == STOCK_COG


async def test_monitor_rereads_capabilities_when_the_runner_comes_back(
    loopback: tuple[Loopback, RunnerClient],
) -> None:
    state, client = loopback
    hardware = ["gpu"]
    state.capabilities = lambda: web.json_response(
        {"runnerType": "conduit-echo", "runnerId": "r", "hardware": hardware[0]}
    )
    monitor = RunnerMonitor(client, interval=0.01, failures_to_gone=2)
    await monitor.check()
    assert monitor.hardware == "gpu" and state.capability_reads == 1
    await monitor.check()
    assert state.capability_reads == 1  # known: not asked again while it stays up

    state.healthy = False
    hardware[0] = "cpu"  # e.g. redeployed on another machine
    await monitor.check()
    await monitor.check()
    assert monitor.gone
    state.healthy = True
    await monitor.check()
    assert not monitor.gone
    assert monitor.hardware == "cpu" and state.capability_reads == 2


def test_backoff_obeys_retry_after_with_upward_jitter_only() -> None:
    backoff = StartBackoff(initial=0.05, max_delay=2.0, max_retry_after=30.0, jitter=0.1)
    backoff.rng.seed(1)
    for attempt in range(20):
        assert 3.0 <= backoff.delay(attempt, 3.0) <= 3.3
    assert 30.0 <= backoff.delay(0, 3600.0) <= 33.0  # capped
    assert backoff.delay(0, 0.0) >= 0.05  # Retry-After: 0 is no busy loop


def test_backoff_without_retry_after_is_exponential_with_jitter() -> None:
    backoff = StartBackoff(initial=0.05, max_delay=2.0, rng=random.Random(2))
    for attempt in range(12):
        ceiling = min(0.05 * 2**attempt, 2.0)
        assert ceiling / 2 <= backoff.delay(attempt, None) <= ceiling


def test_http_date_is_read_against_the_wall_clock() -> None:
    ahead = email.utils.formatdate(time.time() + 100, usegmt=True)
    value = parse_retry_after(ahead)
    assert value is not None and 98 <= value <= 100
