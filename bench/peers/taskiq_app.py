"""taskiq on taskiq-redis's Redis Streams broker: a no-op task that counts itself.

Worker: ``python -m taskiq worker bench.peers.taskiq_app:broker --workers 1``. No result
backend. The broker's consumer group starts at ``$``: anything sent before the worker first
connected is never read, so the benchmark waits for a ping to be counted before it starts.
"""

from __future__ import annotations

import os

from redis.asyncio import Redis
from taskiq_redis import RedisStreamBroker

from bench.peers import DONE_KEY

broker = RedisStreamBroker(url=os.environ["REDIS_URL"])
counter = Redis.from_url(os.environ["REDIS_URL"])


@broker.task(task_name="bench.noop")
async def noop() -> None:
    await counter.incr(DONE_KEY)


async def startup() -> None:
    await broker.startup()


async def enqueue_one() -> None:
    await noop.kiq()
