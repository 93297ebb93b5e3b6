"""Upgrading to hash-tagged stream names loses nothing: entries an earlier release appended to
the untagged streams (``input:prediction:dp-owner/name:<shard>``) are run by a director of this
release, whether they were there when it started or an api of the earlier release adds them
while the rollout is under way."""

from __future__ import annotations

import dataclasses
import uuid

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.admin import Admin
from tests.fixtures.predictions import new_predictions
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import until
from tracker import store
from tracker.keys import Target
from tracker.states import Status

DEADLINE = 60.0


async def _earlier_release_enqueues(
    engine: AsyncEngine, redis: Redis, name: str, version: str, stream: str, count: int
) -> list[str]:
    """What an api of the earlier release did: insert the rows, append to an untagged stream."""
    news = [
        dataclasses.replace(new, deployment=name, version_id=version, target=f"dp-{name}")
        for new in await new_predictions(engine, [{"prompt": "old"}] * count)
    ]
    async with engine.begin() as conn:
        for new in news:
            await store.insert_prediction(conn, new)
    for new in news:
        await redis.xadd(stream, {"id": new.id})
    return [new.id for new in news]


async def _wait_succeeded(engine: AsyncEngine, ids: list[str]) -> None:
    async def statuses() -> set[str | None] | None:
        rows = [await store.get(engine, pid) for pid in ids]
        found = {row["status"] if row else None for row in rows}
        assert not found & {Status.FAILED.value, Status.ABORTED.value}, rows
        return found if found == {Status.SUCCEEDED.value} else None

    await until(statuses, f"{ids} succeeded", DEADLINE)


async def _wait_drained(redis: Redis, streams: list[str]) -> None:
    async def empty() -> bool:
        return not any([await redis.xlen(stream) for stream in streams])

    await until(empty, f"{streams} empty", DEADLINE)


async def test_untagged_streams_are_drained_by_an_upgraded_director(
    launcher: Launcher, admin: Admin, engine: AsyncEngine, redis_url: str
) -> None:
    name = f"test/legacy-{uuid.uuid4().hex[:8]}"
    _, runner_url = launcher.runner("echo", concurrency=2)
    version = admin.create_model(name, runner_url)
    admin.create_deployment(name, name, shards=2, visibility="public")
    legacy = Target("dp", name, 2).legacy_streams()
    redis: Redis = Redis.from_url(redis_url)
    try:
        before = await _earlier_release_enqueues(engine, redis, name, version, legacy[0], 3)
        launcher.director(name, runner_url, concurrency=2, claim_interval="0.2")
        await _wait_succeeded(engine, before)

        # The rollout is not over: an api of the earlier release still appends to a stream
        # that did not exist when the director started.
        assert not await redis.exists(legacy[1])
        during = await _earlier_release_enqueues(engine, redis, name, version, legacy[1], 3)
        await _wait_succeeded(engine, during)

        await _wait_drained(redis, legacy)  # every entry acknowledged and removed
    finally:
        await redis.delete(*legacy)
        await redis.aclose()
