"""The event hub against a real Redis: order, positions, late joiners, the cap and release."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tracker.event_hub import EventHub, Subscription
from tracker.events import Event, EventLog, EventType

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


async def _take(sub: Subscription, n: int) -> list[Event]:
    """The next ``n`` events, within a deadline."""
    events = []
    async with asyncio.timeout(DEADLINE):
        for _ in range(n):
            event = await sub.next()
            assert event is not None, "released"
            events.append(event)
    return events


async def test_subscribers_get_their_events_in_order_from_their_positions(
    hub: EventHub, redis: Redis
) -> None:
    log = EventLog(redis)
    pid = uuid.uuid4().hex
    first = hub.subscribe(pid)
    assert first is not None
    await log.append(pid, [(EventType.OUTPUT, "a"), (EventType.OUTPUT, "b")])
    early = await _take(first, 2)
    assert [e.data for e in early] == ["a", "b"]
    # Joining late from the start replays; joining after "a" skips it.
    replay = hub.subscribe(pid)
    resume = hub.subscribe(pid, early[0].id)
    assert replay is not None and resume is not None
    await log.finish(pid, "succeeded", None, final='{"id": "x"}')
    assert [e.data for e in await _take(replay, 2)] == ["a", "b"]
    assert [e.data for e in await _take(resume, 1)] == ["b"]
    for sub in (first, replay, resume):
        tail = await _take(sub, 2)
        assert [e.type for e in tail] == [EventType.STATUS, EventType.DONE]
        assert tail[1].prediction == '{"id": "x"}'
        sub.close()
    assert hub.waiters == 0


async def test_past_the_cap_subscribe_declines_and_release_answers_everyone(
    hub: EventHub,
) -> None:
    subs = [hub.subscribe(uuid.uuid4().hex) for _ in range(3)]
    assert all(sub is not None for sub in subs)
    assert hub.subscribe(uuid.uuid4().hex) is None  # max_waiters=3
    subs[0].close()  # type: ignore[union-attr]
    again = hub.subscribe(uuid.uuid4().hex)
    assert again is not None
    hub.release()
    for sub in [*subs[1:], again]:
        assert sub is not None
        async with asyncio.timeout(DEADLINE):
            assert await sub.next() is None
        assert sub.released
    assert hub.subscribe(uuid.uuid4().hex) is None
