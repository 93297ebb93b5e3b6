"""The event hub against a real Redis: order, positions, late joiners, the cap and release."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from tracker import event_readers, keys
from tracker.event_hub import EventHub, Subscription
from tracker.event_readers import READ_COUNT
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


def _following_one(hub: EventHub, redis: Redis) -> tuple[EventLog, str, Subscription]:
    """An event log, a new prediction id and the hub's subscription to it."""
    pid = uuid.uuid4().hex
    sub = hub.subscribe(pid)
    assert sub is not None
    return EventLog(redis), pid, sub


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


class CountingRedis(Redis):
    """A real client that remembers which streams each of its ``XREAD``s named."""

    reads: list[list[str]]

    async def xread(self, streams: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.reads.append([k.decode() if isinstance(k, bytes) else str(k) for k in streams])
        return await super().xread(streams, *args, **kwargs)


async def test_an_event_costs_a_read_of_its_own_stream_not_of_every_watched_one(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader blocks on the doorbell and reads only the streams a ring names: with 300
    waiters, one prediction's event is one read naming that stream (blocking on every watched
    stream instead cost a read naming all 300 after each event)."""
    monkeypatch.setattr(event_readers, "SWEEP_INTERVAL", 3600.0)  # only the first sweep
    reader = CountingRedis.from_url(redis_url, single_connection_client=True)
    reader.reads = []
    hub = EventHub(reader, redis, max_waiters=400, block_ms=60_000)
    hub.start()
    log = EventLog(redis)
    try:
        pids = [uuid.uuid4().hex for _ in range(300)]
        subs = [hub.subscribe(pid) for pid in pids]
        first = subs[0]
        assert first is not None
        await log.append(pids[0], [(EventType.OUTPUT, "warm")])  # every new stream read once
        assert [e.data for e in await _take(first, 1)] == ["warm"]
        before = len(reader.reads)
        await log.append(pids[1], [(EventType.OUTPUT, "one")])
        second = subs[1]
        assert second is not None
        assert [e.data for e in await _take(second, 1)] == ["one"]
        named = [stream for read in reader.reads[before:] for stream in read]
        assert log.key(pids[1]) in named
        assert len(set(named) - {keys.doorbell_key()}) <= 2, named  # no sweep of all 300
    finally:
        await hub.close()


async def test_a_write_that_rings_no_doorbell_still_reaches_its_waiter(
    hub: EventHub, redis: Redis
) -> None:
    """A writer of an earlier release appends without ringing: the reader's sweep (every
    ``SWEEP_INTERVAL`` while it has waiters) delivers it."""
    log, pid, sub = _following_one(hub, redis)
    await redis.xadd(log.key(pid), {"type": "output", "data": "quiet"})
    assert [e.data for e in await _take(sub, 1)] == ["quiet"]


async def test_a_backlog_longer_than_one_read_arrives_whole_and_in_order(
    hub: EventHub, redis: Redis
) -> None:
    """One ring for 1,200 events: the reader reads on past ``READ_COUNT`` by itself."""
    log, pid, sub = _following_one(hub, redis)
    count = READ_COUNT * 2 + 200
    await log.append(pid, [(EventType.LOGS, str(n)) for n in range(count)])
    assert [e.data for e in await _take(sub, count)] == [str(n) for n in range(count)]
