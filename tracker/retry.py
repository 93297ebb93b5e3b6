"""Retrying a write that must not be lost through a short outage of Postgres or Redis.

A director that holds a prediction's terminal state keeps it (and keeps heartbeating the
queue entry) while the database is briefly away, rather than dropping the result and leaving
the prediction to be reported as interrupted.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSIENT = (DBAPIError, RedisError, OSError)


async def persistently(
    what: str, attempt: Callable[[], Awaitable[T]], give_up_after: float = 120.0
) -> T:
    """Run ``attempt`` until it succeeds; after ``give_up_after`` seconds re-raise the error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_after
    delay = 0.1
    failures = 0
    while True:
        try:
            return await attempt()
        except TRANSIENT as error:
            failures += 1
            if loop.time() + delay > deadline:
                raise
            if failures == 1:
                log.warning("%s failed, retrying until it works: %r", what, error)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 5.0)
