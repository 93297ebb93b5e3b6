"""arq: a no-op job that counts itself; the worker polls every 10 ms.

Worker: ``python -m arq bench.peers.arq_app.WorkerSettings``. Results are not kept
(``keep_result=0``), like the other peers, which run without a result backend.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from arq.connections import ArqRedis, RedisSettings, create_pool

from bench.peers import DONE_KEY

REDIS = RedisSettings.from_dsn(os.environ["REDIS_URL"])


async def noop(ctx: dict[str, Any]) -> None:
    await ctx["redis"].incr(DONE_KEY)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [noop]
    redis_settings = REDIS
    poll_delay = 0.01
    keep_result = 0


_pool: ArqRedis | None = None


async def enqueue_one() -> None:
    global _pool
    if _pool is None:
        _pool = await create_pool(REDIS)
    await _pool.enqueue_job("noop")
