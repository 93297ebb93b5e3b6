"""The catalogue's generation counter on a real Redis: concurrent reads share a GET, and a read
never answers from a GET sent before it began (read-your-writes across processes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from catalog.generation import CatalogGeneration
from tracker.keys import CATALOG_GENERATION_KEY


class HeldGets:
    """The real client's GET, counted; the first one's answer is held back until released,
    as a GET still on the wire would be."""

    def __init__(self, redis: Redis) -> None:
        self.real = redis.get
        self.sent = 0
        self.first_answered = asyncio.Event()
        self.release = asyncio.Event()
        redis.get = self  # type: ignore[method-assign]

    async def __call__(self, key: Any) -> Any:
        self.sent += 1
        value = await self.real(key)
        if self.sent == 1:
            self.first_answered.set()
            await self.release.wait()
        return value


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def test_reads_while_a_get_is_in_flight_share_the_next_one(redis: Redis) -> None:
    generation = CatalogGeneration(redis)
    gets = HeldGets(redis)
    first = asyncio.ensure_future(generation.current())
    await gets.first_answered.wait()
    before = int(await gets.real(CATALOG_GENERATION_KEY) or 0)  # not counted
    # A change committed and announced by another process after the first GET was answered.
    await CatalogGeneration(redis).bump()
    later = [asyncio.ensure_future(generation.current()) for _ in range(20)]
    # Released after each of them has begun its read: their first steps are queued before it.
    asyncio.get_running_loop().call_soon(gets.release.set)
    seen = await asyncio.gather(*later)
    assert await first == before
    # Every read that began after the bump sees it, from one GET sent after the first answered.
    assert seen == [before + 1] * 20
    assert gets.sent == 2


async def test_an_idle_process_reads_at_once_and_each_read_is_fresh(redis: Redis) -> None:
    generation = CatalogGeneration(redis)
    gets = HeldGets(redis)
    gets.release.set()
    first = await generation.current()
    await generation.bump()
    assert await generation.current() == (first or 0) + 1
    assert gets.sent == 2
