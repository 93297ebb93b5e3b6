"""The durable webhook dispatcher sleeps until the next pending delivery falls due, not until
its next poll: a retry goes out when its backoff ends though the poll interval is an hour.

The dispatcher runs against a database of this module's own: it leases every due row it finds.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy.ext.asyncio import AsyncEngine

from conduit.services import ServiceUrls
from core.ssrf import parse_cidrs
from tests.fixtures import deliveries
from tests.fixtures.waiting import until
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.webhooks import WebhookPolicy, open_session

BACKOFF = 0.5
#: Far longer than the test: a retry that waited for the poll would not come in time.
POLL = 3600.0


@pytest.fixture(scope="module")
def own_database(services: ServiceUrls) -> str:
    return deliveries.own_database(services, "conduit_next_due")


@pytest.fixture
async def engine(own_database: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(own_database)
    yield engine
    await engine.dispose()


class FailsFirst:
    """Answers 500 to the first POST, 200 to the rest; notes when each arrived."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.arrivals.append(time.monotonic())
        return web.Response(status=500 if len(self.arrivals) == 1 else 200, text="ok")


@pytest.fixture
async def receiver() -> AsyncIterator[FailsFirst]:
    fails = FailsFirst()
    app = web.Application()
    app.router.add_post("/hook", fails.handle)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    fails.url = f"http://127.0.0.1:{server.port}/hook"
    try:
        yield fails
    finally:
        await server.close()


async def test_a_retry_goes_out_when_its_backoff_ends_not_at_the_next_poll(
    engine: AsyncEngine, receiver: FailsFirst
) -> None:
    policy = WebhookPolicy(
        allow=parse_cidrs("127.0.0.0/8"), schedule=(BACKOFF,), jitter=0.0, poll_interval=POLL
    )
    async with open_session(policy) as session:
        dispatcher = Dispatcher(engine, policy, session)
        dispatcher.start()
        try:
            # The dispatcher's first pass found nothing pending: it sleeps for the poll.
            delivery = await deliveries.insert_delivery(engine, receiver.url, "next-due")
            dispatcher.wake()  # as the process that wrote the terminal state does

            async def delivered() -> bool:
                return await deliveries.delivery_status(engine, delivery) == "delivered"

            await until(delivered, "the retry delivered", timeout=30)
        finally:
            await dispatcher.stop()
    first, retry = receiver.arrivals
    assert retry - first >= BACKOFF
