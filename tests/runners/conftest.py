"""Real runner servers and a real webhook receiver, both on loopback.

Tests synchronise on what arrives (webhooks, HTTP answers) with deadlines, never on sleeps.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from runners.config import RunnerConfig
from runners.model import Model
from runners.models.echo import EchoModel
from runners.server import SERVICE, create_app
from runners.service import RunnerService

DEADLINE = 10.0
TERMINAL = {"succeeded", "failed", "canceled"}


@dataclass
class Delivery:
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class WebhookReceiver:
    """Records every webhook per key; can refuse the first terminal deliveries with 503."""

    base_url: str = ""
    refuse_terminal: int = 0
    terminal_attempts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    queues: dict[str, asyncio.Queue[Delivery]] = field(
        default_factory=lambda: defaultdict(asyncio.Queue)
    )
    arrivals: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    """A key's first webhook is not answered (nor recorded) until its gate is set."""

    def url(self, key: str) -> str:
        return f"{self.base_url}/hooks/{key}"

    async def handle(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        body = await request.json()
        self.arrivals[key] += 1
        if self.arrivals[key] == 1 and (gate := self.gates.get(key)) is not None:
            await gate.wait()
        if body["status"] in TERMINAL:
            self.terminal_attempts[key] += 1
            if self.refuse_terminal > 0:
                self.refuse_terminal -= 1
                return web.Response(status=503)
        self.queues[key].put_nowait(Delivery(dict(request.headers), body))
        return web.Response(status=200)

    async def next(self, key: str) -> Delivery:
        return await asyncio.wait_for(self.queues[key].get(), DEADLINE)

    async def until(self, key: str, predicate: Callable[[dict[str, Any]], bool]) -> list[Delivery]:
        """Every delivery for ``key`` up to and including the first matching ``predicate``."""
        seen: list[Delivery] = []
        while True:
            seen.append(await self.next(key))
            if predicate(seen[-1].body):
                return seen

    async def until_terminal(self, key: str) -> list[Delivery]:
        return await self.until(key, lambda body: body["status"] in TERMINAL)

    def pending(self, key: str) -> int:
        return self.queues[key].qsize()


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    hooks = WebhookReceiver()
    app = web.Application()
    app.router.add_post("/hooks/{key}", hooks.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    hooks.base_url = f"http://127.0.0.1:{server.port}"
    yield hooks
    await server.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEADLINE)) as session:
        yield session


@dataclass
class Runner:
    url: str
    service: RunnerService


StartRunner = Callable[..., Awaitable[Runner]]

# No runner token here: these tests are the runner's protocol, not its trust boundary
# (tests/runners/test_runner_auth.py), so they cancel and stop it from loopback, trusted.
TEST_CONFIG = RunnerConfig(
    throttle_interval=0.5,
    webhook_backoff_base=0.001,
    webhook_timeout=5.0,
    shutdown_grace=1.0,
    trust_loopback=True,
)


@pytest.fixture
async def start_runner() -> AsyncIterator[StartRunner]:
    """Start runner servers on loopback; keyword arguments override :class:`RunnerConfig`."""
    servers: list[TestServer] = []

    async def start(
        model: Model | None = None,
        concurrency: int = 1,
        wait_ready: bool = True,
        **config: Any,
    ) -> Runner:
        app = create_app(model or EchoModel(), concurrency, TEST_CONFIG.model_copy(update=config))
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        runner = Runner(f"http://127.0.0.1:{server.port}", app[SERVICE])
        if wait_ready:
            assert await asyncio.wait_for(runner.service.wait_ready(), DEADLINE)
        return runner

    yield start
    for server in servers:
        await server.close()
