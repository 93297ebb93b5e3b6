"""The queue, the event log and the api's event hub on a real Redis Cluster: nothing they send
spans slots."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from director.queue import Queue, connect
from tracker import keys
from tracker.event_hub import EventHub
from tracker.events import EventLog, EventType

DEADLINE = 10.0


@pytest.fixture
async def cluster(redis_url: str) -> AsyncIterator[Redis]:
    client = connect(redis_url, max_connections=16)
    yield client
    await client.aclose()


async def test_a_blocking_read_across_slots_ends_with_the_first_and_keeps_the_others(
    cluster: Redis,
) -> None:
    name = uuid.uuid4().hex[:8]
    deployment, version = keys.input_stream("dp", f"o/{name}", 0), keys.input_stream("vp", name, 0)
    assert keys.slot_tag(deployment) != keys.slot_tag(version)
    queue = Queue(cluster)
    await queue.ensure_groups([deployment, version])
    try:
        reading = asyncio.create_task(queue.read([deployment, version], "c1", 1, 10_000))
        await queue.enqueue([version], "from-version")
        first = await asyncio.wait_for(reading, 10)
        assert [(e.stream, e.prediction_id) for e in first] == [(version, "from-version")]
        # The deployment's read is still blocked; the next call takes what it brings.
        await queue.enqueue([deployment], "from-deployment")
        second = await asyncio.wait_for(queue.read([deployment, version], "c1", 1, 10_000), 10)
        assert [(e.stream, e.prediction_id) for e in second] == [(deployment, "from-deployment")]
        # And the version's read, issued again by that call, is the one that ends next.
        await queue.enqueue([version], "again")
        third = await asyncio.wait_for(queue.read([deployment, version], "c1", 1, 200), 10)
        assert [(e.stream, e.prediction_id) for e in third] == [(version, "again")]
        for entry in first + second + third:
            await queue.ack(entry.stream, entry.id)
        stats = await queue.stats([deployment, version])
        assert [(s.length, s.pending) for s in stats] == [(0, 0), (0, 0)]
    finally:
        await queue.close()


async def test_event_appends_of_many_predictions_at_once_land_in_order(cluster: Redis) -> None:
    log = EventLog(cluster)
    ids = [uuid.uuid4().hex for _ in range(60)]
    assert len({keys.slot_tag(log.key(i)) for i in ids}) > 1

    async def run(pid: str) -> None:
        for n in range(3):
            await log.append(pid, [(EventType.OUTPUT, f"{pid}-{n}")])
        await log.finish(pid, "succeeded", None)

    await asyncio.gather(*(run(pid) for pid in ids))
    for pid in ids:
        events = await log.read(pid, "0", None)
        assert [e.data for e in events if e.type is EventType.OUTPUT] == [
            f"{pid}-{n}" for n in range(3)
        ]
        assert events[-1].type is EventType.DONE
        assert await log.is_done(pid)


async def test_the_hub_reads_every_tag_and_wakes_a_blocked_reader(
    redis_url: str, cluster: Redis
) -> None:
    """Waiters on streams of many tags get their events; a waiter that joins a tag whose reader
    is blocked (for far longer than the test waits) is served at once: the reader is woken."""
    hub = EventHub.for_url(redis_url, cluster, 100, 60_000, "scale-test-hub")
    hub.start()
    log = EventLog(cluster)
    try:
        ids = [uuid.uuid4().hex for _ in range(40)]
        by_tag: dict[str, list[str]] = {}
        for pid in ids:
            by_tag.setdefault(keys.slot_tag(log.key(pid)), []).append(pid)
        subs = {pid: hub.subscribe(pid) for pid in ids}
        for pid in ids:
            await log.finish(pid, "succeeded", None)
        async with asyncio.timeout(DEADLINE):
            for pid, sub in subs.items():
                assert sub is not None
                kinds = [(await sub.next()), (await sub.next())]
                assert [e.type for e in kinds if e] == [EventType.STATUS, EventType.DONE], pid
        # Each tag's reader is now blocked for a minute; a newcomer on such a tag is served.
        tag = next(iter(by_tag))
        newcomer = next(
            pid
            for pid in (uuid.uuid4().hex for _ in range(1000))
            if keys.slot_tag(log.key(pid)) == tag
        )
        sub = hub.subscribe(newcomer)
        assert sub is not None
        await log.append(newcomer, [(EventType.OUTPUT, "late")])
        async with asyncio.timeout(DEADLINE):
            event = await sub.next()
        assert event is not None and event.data == "late"
    finally:
        await hub.close()
