"""The durable webhook dispatcher waits out a starved database pool: an attempt whose outcome
cannot be recorded at once (every pooled connection busy past ``pool_timeout``) is recorded
once a connection frees, not left to its lease and sent again.

The dispatcher runs against a database of this module's own: it leases every due row it finds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from conduit.services import ServiceUrls
from core.ssrf import parse_cidrs
from tests.fixtures import deliveries
from tests.fixtures.waiting import until
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.webhooks import WebhookPolicy, open_session

POOL_SIZE = 1  # and as many again of overflow: two connections in all
POOL_TIMEOUT = 0.3
#: Far longer than the test: a delivery left to its lease would not be sent again in time.
LEASE = 120.0


@pytest.fixture(scope="module")
def own_database(services: ServiceUrls) -> str:
    return deliveries.own_database(services, "conduit_starved")


@pytest.fixture
async def engine(own_database: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(own_database, pool_size=POOL_SIZE, pool_timeout=POOL_TIMEOUT)
    yield engine
    await engine.dispose()


class HeldReceiver:
    """Answers 200 to each POST once the test lets it go."""

    def __init__(self) -> None:
        self.posts = 0
        self.arrived = asyncio.Event()
        self.go = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.posts += 1
        self.arrived.set()
        await self.go.wait()
        return web.Response(text="ok")


@pytest.fixture
async def receiver() -> AsyncIterator[HeldReceiver]:
    held = HeldReceiver()
    app = web.Application()
    app.router.add_post("/hook", held.handle)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    held.url = f"http://127.0.0.1:{server.port}/hook"
    try:
        yield held
    finally:
        held.go.set()
        await server.close()


async def test_an_outcome_recorded_through_a_starved_pool_is_not_sent_again(
    engine: AsyncEngine, receiver: HeldReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    delivery = await deliveries.insert_delivery(engine, receiver.url, "starved")
    policy = WebhookPolicy(allow=parse_cidrs("127.0.0.0/8"), lease=LEASE, poll_interval=0.1)
    async with open_session(policy) as session:
        dispatcher = Dispatcher(engine, policy, session)
        dispatcher.start()
        try:
            await asyncio.wait_for(receiver.arrived.wait(), 30)
            # The attempt is under way: take every connection of the pool, then let the
            # receiver answer.
            held: list[AsyncConnection] = []
            for _ in range(2 * POOL_SIZE):
                conn = await engine.connect()
                await conn.execute(text("SELECT 1"))
                held.append(conn)
            receiver.go.set()

            async def recording_failed() -> bool:
                return any("recording webhook" in r.getMessage() for r in caplog.records)

            # (Not recorded and not retried, the attempt would end here and wait out its lease.)
            await until(recording_failed, "a failed recording, retried", timeout=10)
            for conn in held:
                await conn.close()

            async def delivered() -> bool:
                return await deliveries.delivery_status(engine, delivery) == "delivered"

            await until(delivered, "the delivery recorded", timeout=20)
        finally:
            await dispatcher.stop()
    assert receiver.posts == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
