"""Retrying through short outages: the one backoff formula, the one list of transient errors.

``TRANSIENT`` is what an outage of Postgres or Redis raises (a dead connection is an
``OSError``): every loop that waits out an outage catches exactly these, adding only errors of
its own peers (the director adds a runner's). ``backoff_delay`` is the only backoff formula:
the queue's read loop, the runner start backoff, ``persistently`` and the terminal webhook
schedule all take their waits from it, each with its own numbers.

A director that holds a prediction's terminal state keeps it (and keeps heartbeating the
queue entry) while the database is briefly away, rather than dropping the result and leaving
the prediction to be reported as interrupted: ``persistently``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Errors of an unreachable or restarting Postgres or Redis: worth retrying, never data errors.
TRANSIENT = (DBAPIError, RedisError, OSError)

#: ``persistently``: 0.1 s doubling to 5 s, each wait within ±20 %.
PERSISTENT_INITIAL = 0.1
PERSISTENT_CAP = 5.0
PERSISTENT_JITTER = (0.8, 1.2)


def backoff_delay(
    attempt: int,
    *,
    initial: float = 0.0,
    cap: float = math.inf,
    schedule: Sequence[float] = (),
    jitter: tuple[float, float] = (1.0, 1.0),
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry ``attempt`` (0: the first retry).

    The base is ``schedule[attempt]`` when a schedule is given (its last step repeats past its
    end), otherwise ``initial`` doubled per attempt; at most ``cap``. It is then multiplied by a
    uniform draw from ``jitter``: ``(1, 1)`` none, ``(0.5, 1)`` "equal jitter" (never more than
    the base), ``(1, 1.2)`` only ever longer, ``(0.8, 1.2)`` either way.
    """
    if schedule:
        base = schedule[min(attempt, len(schedule) - 1)]
    else:
        base = initial * 2.0 ** min(attempt, 64)
    base = min(base, cap)
    low, high = jitter
    if low == high:
        return base * low
    draw = rng.uniform if rng is not None else random.uniform
    return base * draw(low, high)


async def persistently(
    what: str, attempt: Callable[[], Awaitable[T]], give_up_after: float = 120.0
) -> T:
    """Run ``attempt`` until it succeeds; after ``give_up_after`` seconds re-raise the error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_after
    failures = 0
    while True:
        try:
            return await attempt()
        except TRANSIENT as error:
            delay = backoff_delay(
                failures, initial=PERSISTENT_INITIAL, cap=PERSISTENT_CAP, jitter=PERSISTENT_JITTER
            )
            failures += 1
            if loop.time() + delay > deadline:
                raise
            if failures == 1:
                log.warning("%s failed, retrying until it works: %r", what, error)
            await asyncio.sleep(delay)
