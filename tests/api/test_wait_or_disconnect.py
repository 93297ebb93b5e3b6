"""``Prefer: wait`` races the prediction's ``done`` against its client leaving, through the
same watcher the synchronous lane uses (``lane.departure``): whichever comes first ends the
wait, and the waiter's place in the hub is given back either way."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from starlette.requests import Request
from starlette.types import Message

from api.prefer import WaitEnd, wait_or_disconnect
from tests.fixtures.waiting import until
from tracker.event_hub import EventHub
from tracker.events import EventLog

DEADLINE = 10.0


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def hub(redis_url: str, redis: Redis) -> AsyncIterator[EventHub]:
    hub = EventHub(Redis.from_url(redis_url, single_connection_client=True), redis, max_waiters=3)
    hub.start()
    yield hub
    await hub.close()


async def _subscribed(hub: EventHub) -> None:
    async def waiting() -> int:
        return hub.waiters

    await until(waiting, "the wait subscribed", timeout=DEADLINE, interval=0.01)


def _request(channel: asyncio.Queue[Message]) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    return Request(scope, receive=channel.get)


async def test_a_client_that_leaves_ends_the_wait(hub: EventHub) -> None:
    channel: asyncio.Queue[Message] = asyncio.Queue()
    await channel.put({"type": "http.request", "body": b"", "more_body": False})
    waiting = asyncio.ensure_future(
        wait_or_disconnect(_request(channel), hub, uuid.uuid4().hex, 60)
    )
    await _subscribed(hub)
    await channel.put({"type": "http.disconnect"})
    waited = await asyncio.wait_for(waiting, DEADLINE)
    assert waited.end is WaitEnd.CLIENT_LEFT
    assert hub.waiters == 0


async def test_done_ends_the_wait_and_the_watch(hub: EventHub, redis: Redis) -> None:
    channel: asyncio.Queue[Message] = asyncio.Queue()
    pid = uuid.uuid4().hex
    waiting = asyncio.ensure_future(wait_or_disconnect(_request(channel), hub, pid, 60))
    await _subscribed(hub)
    await EventLog(redis).finish(pid, "succeeded", None, final='{"id": "x"}')
    waited = await asyncio.wait_for(waiting, DEADLINE)
    assert waited.end is WaitEnd.DONE
    assert waited.prediction == '{"id": "x"}'
    assert hub.waiters == 0


async def test_a_full_hub_declines_at_once(hub: EventHub) -> None:
    channel: asyncio.Queue[Message] = asyncio.Queue()
    held = [hub.subscribe(uuid.uuid4().hex) for _ in range(hub.max_waiters)]
    waited = await wait_or_disconnect(_request(channel), hub, uuid.uuid4().hex, 60)
    assert waited.end is WaitEnd.DECLINED
    for sub in held:
        assert sub is not None
        sub.close()
