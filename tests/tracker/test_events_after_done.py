"""Nothing follows ``done`` in a prediction's event stream, whoever appends (real Redis)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tracker import keys
from tracker.events import EventLog, EventType


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def _types(log: EventLog, pid: str) -> list[str]:
    return [event.type.value for event in await log.read(pid, "0", None)]


async def test_a_stalled_attempts_late_events_are_dropped_after_the_end(redis: Redis) -> None:
    log = EventLog(redis)
    pid = uuid.uuid4().hex
    await log.append(pid, [(EventType.STATUS, "processing"), (EventType.OUTPUT, "a")])
    await log.finish(pid, "succeeded", None, final='{"id": "x"}')
    doorbell = keys.doorbell_key("")
    rung_before = await redis.xlen(doorbell)
    # A paused attempt resumes past the end and publishes what it had checked its fence for.
    await log.append(pid, [(EventType.STATUS, "processing"), (EventType.OUTPUT, "late")])
    await log.finish(pid, "failed", "too late")
    assert await _types(log, pid) == ["status", "output", "status", "done"]
    assert await log.is_done(pid)
    # Nobody is woken for what was not appended.
    assert await redis.xlen(doorbell) == rung_before


async def test_other_streams_in_the_same_call_still_get_theirs(redis: Redis) -> None:
    log = EventLog(redis)
    ended, live = uuid.uuid4().hex, uuid.uuid4().hex
    await log.finish(ended, "succeeded", None)
    # Submitted together, so the batcher writes both in one script call.
    await asyncio.gather(
        log.append(ended, [(EventType.OUTPUT, "late")]),
        log.append(live, [(EventType.OUTPUT, "a")]),
    )
    assert await _types(log, ended) == ["status", "done"]
    assert await _types(log, live) == ["output"]
