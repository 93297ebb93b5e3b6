"""A start whose connection breaks off after the request went out is never sent again under
the same claim: the runner may have taken it and died running it, and a restarted runner
would run it a second time. The entry goes back to the queue, where a redelivery counts the
run against the deployment's bounds (a poison input that kills its runner is dead-lettered
after ``max_deliveries`` runs, not run until its timeout)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from director.attempts import Attempt
from director.execution import Execution
from director.leases import Lease
from director.metrics import DirectorMetrics
from director.queue import Entry
from director.runner_monitor import RunnerMonitor
from protocol.client import RunnerClient
from protocol.errors import NoAnswer
from protocol.session import without_resends
from tests.fixtures.fences import Unfenced
from tests.fixtures.predictions import inserted_prediction
from tracker import attempt_writes, store
from tracker.batch_writes import StateWrites
from tracker.events import EventLog
from tracker.publishing import Publishing
from tracker.render import PredictionLinks
from tracker.tracker import AttemptTracker


class DyingRunner:
    """A loopback server that reads each request and drops the connection unanswered, as a
    runner process killed by the model it was handed."""

    def __init__(self) -> None:
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"PUT "):
            self.requests += 1
        writer.transport.abort()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def dying() -> AsyncIterator[tuple[DyingRunner, str]]:
    runner = DyingRunner()
    url = await runner.start()
    yield runner, url
    await runner.stop()


async def test_a_start_that_broke_off_is_left_to_the_queue(
    engine: AsyncEngine, redis_url: str, dying: tuple[DyingRunner, str]
) -> None:
    server, url = dying
    pid = await inserted_prediction(engine)
    row = await attempt_writes.claim(engine, pid, "director-a")
    assert row is not None
    redis = Redis.from_url(redis_url)
    tracker = AttemptTracker(
        StateWrites(engine),
        row,
        Publishing(EventLog(redis), PredictionLinks("http://conduit.test"), Unfenced()),
        0.2,
    )
    try:
        async with without_resends(aiohttp.ClientSession()) as session:
            runner = RunnerClient(url, session)
            execution = Execution(
                runner=runner,
                tracker=tracker,
                attempt=Attempt(Entry("input:prediction:{dp-t/t}:0", "0-1", pid), Lease(pid)),
                webhook="http://127.0.0.1:9/runner",
                timeout=30,
                cancel_grace=0.1,
                monitor=RunnerMonitor(runner, 1.0, 3),  # not counted gone: it may come back
                metrics=DirectorMetrics(),
            )
            with pytest.raises(NoAnswer):
                await execution.run({})
    finally:
        await tracker.close()
        await redis.aclose()
    assert server.requests == 1
    stored = await store.get(engine, pid)
    assert stored is not None and stored["status"] == "starting"  # nothing written: not failed
