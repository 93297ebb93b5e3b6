"""Shared permits borrowed through a real Redis (:mod:`lane.loans`): the replicas together
never hold more than the runner's shared permits, a permit given back is borrowable by another
replica at once, and a replica that left the lane loses its loans."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from lane.events import Repay
from lane.loans import Loans
from tracker.keys import LANE_MEMBERS, lane_loans_key


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client: Redis = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def _join(redis: Redis, *replicas: str) -> None:
    await redis.zadd(LANE_MEMBERS, dict.fromkeys(replicas, round(time.time() * 1000)))


async def test_two_replicas_share_one_permit_without_over_committing(redis: Redis) -> None:
    runner, other = f"r-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
    a, b = (f"api-{uuid.uuid4().hex[:8]}" for _ in range(2))
    await _join(redis, a, b)
    first, second = Loans(redis, a, 3.0), Loans(redis, b, 3.0)
    try:
        assert await first.borrow([(runner, 1)]) == runner
        assert await second.borrow([(runner, 1)]) is None  # the one permit is out
        assert await first.borrow([(runner, 1)]) is None  # also for its own holder
        first.repay(Repay("d", runner))
        await first.settled()
        assert await second.borrow([(runner, 1)]) == runner  # back, and borrowable at once
        # Two shared permits: one each.
        assert await first.borrow([(runner, 1), (other, 2)]) == other
        assert await first.borrow([(other, 2)]) == other
        assert await second.borrow([(other, 2)]) is None
    finally:
        await redis.zrem(LANE_MEMBERS, a, b)
        await redis.delete(lane_loans_key(runner), lane_loans_key(other))


async def test_a_replica_that_left_the_lane_loses_its_loans(redis: Redis) -> None:
    runner = f"r-{uuid.uuid4().hex[:8]}"
    gone, live = f"api-{uuid.uuid4().hex[:8]}", f"api-{uuid.uuid4().hex[:8]}"
    await _join(redis, gone, live)
    try:
        assert await Loans(redis, gone, 3.0).borrow([(runner, 1)]) == runner
        await redis.zrem(LANE_MEMBERS, gone)  # died: pruned from the membership
        assert await Loans(redis, live, 3.0).borrow([(runner, 1)]) == runner
        assert await redis.hgetall(lane_loans_key(runner)) == {live.encode(): b"1"}
    finally:
        await redis.zrem(LANE_MEMBERS, live)
        await redis.delete(lane_loans_key(runner))
