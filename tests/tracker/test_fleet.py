"""The fleet registry on a real Redis: entries written, renewed, expired and read back."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping

import pytest
from redis.asyncio import Redis

from core.ports import free_port
from tests.fixtures.waiting import until
from tracker import keys
from tracker.fleet import (
    FleetEntry,
    FleetRegistry,
    FleetView,
    RunnerState,
    read_fleet,
    runner_entry_id,
)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client: Redis = Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _entry(deployment: str, **changes: object) -> FleetEntry:
    url = f"http://127.0.0.1:{uuid.uuid4().int % 50000 + 10000}"
    fields: dict[str, object] = {
        "id": runner_entry_id(url),
        "url": url,
        "deployment": deployment,
        "version_id": "v" * 64,
        "concurrency": 4,
        "state": RunnerState.READY,
        "hardware": "cpu",
        "heartbeat_at": time.time(),
        "director": "director-1",
        "kind": "conduit",
        "runner_id": "runner-a",
    }
    fields.update(changes)
    return FleetEntry(**fields)  # type: ignore[arg-type]


def _deployment() -> str:
    return f"test/fleet-{uuid.uuid4().hex[:8]}"


def test_an_entry_round_trips_through_json_and_ignores_unknown_members() -> None:
    entry = _entry("a/b")
    assert FleetEntry.from_json(entry.to_json()) == entry
    newer = entry.to_json()[:-1] + b',"gpu_count":8}'
    assert FleetEntry.from_json(newer) == entry
    assert FleetEntry.from_json(b"not json") is None
    assert FleetEntry.from_json(b'{"id": "x"}') is None
    assert FleetEntry.from_json(entry.to_json().replace(b'"ready"', b'"sleepy"')) is None


def test_fleet_keys_share_one_hash_tag() -> None:
    tags = {keys.slot_tag(keys.FLEET_INDEX), keys.slot_tag(keys.fleet_entry_key("r-1"))}
    assert tags == {keys.FLEET_TAG}
    assert runner_entry_id("http://h:1/") == runner_entry_id("http://h:1")
    assert runner_entry_id("http://h:1") != runner_entry_id("http://h:2")


async def test_register_heartbeat_and_deregister(redis: Redis) -> None:
    registry = FleetRegistry(redis, ttl=30)
    deployment = _deployment()
    entry = _entry(deployment)
    await registry.register(entry)
    assert (await read_fleet(redis))[entry.id] == entry
    assert 0 < await redis.pttl(keys.fleet_entry_key(entry.id)) <= 30_000

    later = _entry(deployment, id=entry.id, url=entry.url, heartbeat_at=entry.heartbeat_at + 5)
    await registry.heartbeat(later)
    assert (await read_fleet(redis))[entry.id].heartbeat_at == later.heartbeat_at
    assert await redis.zscore(keys.FLEET_INDEX, entry.id) == round(later.heartbeat_at * 1000)

    await registry.deregister(entry.id)
    assert entry.id not in await read_fleet(redis)
    assert await redis.zscore(keys.FLEET_INDEX, entry.id) is None


async def test_an_entry_expires_when_heartbeats_stop_and_readers_prune_it(redis: Redis) -> None:
    registry = FleetRegistry(redis, ttl=0.3)
    entry = _entry(_deployment())
    await registry.register(entry)
    assert entry.id in await read_fleet(redis)

    async def gone() -> bool:
        return entry.id not in await read_fleet(redis)

    await until(gone, "the entry to expire")
    # The reader that found it missing took it out of the index as well.
    assert await redis.zscore(keys.FLEET_INDEX, entry.id) is None


async def test_a_heartbeat_renews_the_expiry(redis: Redis) -> None:
    registry = FleetRegistry(redis, ttl=0.6)
    entry = _entry(_deployment())
    key = keys.fleet_entry_key(entry.id)
    await registry.register(entry)

    async def run_down() -> bool:
        return 0 < await redis.pttl(key) < 400

    await until(run_down, "the expiry to run down", interval=0.01)
    await registry.heartbeat(entry)
    assert await redis.pttl(key) > 400
    assert entry.id in await read_fleet(redis)
    await registry.deregister(entry.id)


async def test_the_view_lists_ready_runners_of_a_deployment_and_follows_changes(
    redis: Redis,
) -> None:
    registry = FleetRegistry(redis, ttl=30)
    deployment, other = _deployment(), _deployment()
    ready = _entry(deployment, concurrency=8)
    loading = _entry(deployment, state=RunnerState.LOADING)
    elsewhere = _entry(other, version_id="w" * 64)
    changes: list[Mapping[str, FleetEntry]] = []
    view = FleetView(redis, interval=0.05, on_change=changes.append)
    for entry in (ready, loading, elsewhere):
        await registry.register(entry)
    await view.start()
    try:
        assert view.runners_for(deployment) == (ready,)
        assert view.runners_for(deployment)[0].concurrency == 8
        assert view.runners_for(other) == (elsewhere,)
        assert ready in view.runners_serving("v" * 64)
        assert view.runners_for("nobody/nothing") == ()
        assert view.entries[loading.id].state is RunnerState.LOADING
        seen = len(changes)
        assert seen >= 1

        await registry.heartbeat(_entry(deployment, id=loading.id, url=loading.url))
        await until(lambda: _async(len(view.runners_for(deployment)) == 2), "loading → ready")
        assert len(changes) > seen

        await registry.heartbeat(
            _entry(deployment, id=ready.id, url=ready.url, state=RunnerState.DRAINING)
        )
        await registry.deregister(loading.id)
        await until(lambda: _async(view.runners_for(deployment) == ()), "both gone from ready")
        assert view.entries[ready.id].state is RunnerState.DRAINING
        assert loading.id not in view.entries
    finally:
        await view.stop()
        for entry in (ready, loading, elsewhere):
            await registry.deregister(entry.id)


async def test_a_heartbeat_alone_is_not_a_change(redis: Redis) -> None:
    registry = FleetRegistry(redis, ttl=30)
    entry = _entry(_deployment())
    await registry.register(entry)
    changes: list[Mapping[str, FleetEntry]] = []
    view = FleetView(redis, on_change=changes.append)
    try:
        await view.refresh()
        before = len(changes)
        await registry.heartbeat(_entry(entry.deployment, id=entry.id, url=entry.url))
        await view.refresh()
        assert len(changes) == before
        assert view.entries[entry.id].heartbeat_at > entry.heartbeat_at
    finally:
        await registry.deregister(entry.id)


async def test_the_view_keeps_its_copy_while_redis_is_away(redis: Redis) -> None:

    registry = FleetRegistry(redis, ttl=30)
    entry = _entry(_deployment())
    await registry.register(entry)
    unreachable: Redis = Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
    view = FleetView(redis)
    try:
        await view.refresh()
        view.redis = unreachable
        await view.start()  # a failed read is logged, not raised
        assert view.runners_for(entry.deployment) == (entry,)
    finally:
        await view.stop()
        await unreachable.aclose()
        await registry.deregister(entry.id)


async def _async(value: bool) -> bool:
    return value
