"""The catalog's read-through cache: one load per key at a time, refreshed before it expires."""

from __future__ import annotations

import asyncio

import pytest

from tracker import catalog_cache
from tracker.catalog_cache import TTLCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(catalog_cache.time, "monotonic", fake)
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
