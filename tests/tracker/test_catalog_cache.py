"""The catalog's read-through cache: one load per key at a time, refreshed before it expires."""

from __future__ import annotations

import asyncio

import pytest

from catalog import cache
from catalog.cache import TTLCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(cache.time, "monotonic", fake)
    return fake


async def test_concurrent_misses_share_one_load(clock: Clock) -> None:
    loads = 0
    release = asyncio.Event()

    async def load() -> str:
        nonlocal loads
        loads += 1
        await release.wait()
        return "value"

    ttl: TTLCache[str, str] = TTLCache(ttl=5)
    waiting = [asyncio.ensure_future(ttl.get("k", load)) for _ in range(20)]
    release.set()
    assert await asyncio.gather(*waiting) == ["value"] * 20
    assert loads == 1


async def test_refreshed_in_the_background_before_expiry(clock: Clock) -> None:
    values = iter(["old", "new"])
    refreshed = asyncio.Event()

    async def load() -> str:
        value = next(values)
        if value == "new":
            refreshed.set()
        return value

    ttl: TTLCache[str, str] = TTLCache(ttl=5)
    assert await ttl.get("k", load) == "old"
    clock.now += 3.0  # early in its life: served, no reload
    assert await ttl.get("k", load) == "old" and not refreshed.is_set()
    clock.now += 1.5  # in the last fifth: still served at once, reloaded behind it
    assert await ttl.get("k", load) == "old"
    await refreshed.wait()
    assert await ttl.get("k", load) == "new"


async def test_expired_entry_is_loaded_again_and_errors_reach_the_caller(clock: Clock) -> None:
    calls = 0

    async def load() -> str:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("database down")
        return f"v{calls}"

    ttl: TTLCache[str, str] = TTLCache(ttl=5)
    assert await ttl.get("k", load) == "v1"
    clock.now += 10
    with pytest.raises(RuntimeError):
        await ttl.get("k", load)
    assert await ttl.get("k", load) == "v3"  # a failed load is not cached


async def test_a_newer_generation_reloads_an_entry_cached_under_an_older_one(clock: Clock) -> None:
    values = iter(["v1", "v2", "v3"])

    async def load() -> str:
        return next(values)

    ttl: TTLCache[str, str] = TTLCache(ttl=300)
    assert await ttl.get("k", load, generation=7) == "v1"
    assert await ttl.get("k", load, generation=7) == "v1"  # same generation: cached
    assert await ttl.get("k", load, generation=8) == "v2"  # changed elsewhere: loaded again
    assert await ttl.get("k", load) == "v2"  # generation unknown (Redis away): by TTL alone
    assert await ttl.get("k", load, generation=9) == "v3"


async def test_a_load_under_way_for_an_older_generation_is_not_joined(clock: Clock) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    values = iter(["stale", "fresh", "fresh again"])

    async def load() -> str:
        value = next(values)
        if value == "stale":
            started.set()
            await release.wait()
        return value

    ttl: TTLCache[str, str] = TTLCache(ttl=300)
    older = asyncio.ensure_future(ttl.get("k", load, generation=1))
    await started.wait()  # the older load is under way
    assert await ttl.get("k", load, generation=2) == "fresh"
    release.set()
    assert await older == "stale"
    # What the older load stored is never served under the newer generation.
    assert await ttl.get("k", load, generation=2) == "fresh again"
