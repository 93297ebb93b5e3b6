"""Retrying through short outages of Redis and Postgres: the one list of transient errors.

``TRANSIENT`` is what an outage of Postgres or Redis raises (a dead connection is an
``OSError``): every loop that waits out an outage catches exactly these, adding only errors of
its own peers (the director adds a runner's, :data:`core.unreachable.UNREACHABLE`). Its waits
come from the one formula, :func:`core.backoff.backoff_delay`.

A director that holds a prediction's terminal state keeps it (and keeps heartbeating the
queue entry) while the database is briefly away, rather than dropping the result and leaving
the prediction to be reported as interrupted: ``persistently``.

This module imports redis-py and SQLAlchemy; a runner never imports it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ClusterDownError, OutOfMemoryError, ReadOnlyError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from core.backoff import backoff_delay

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Errors of an unreachable or restarting Postgres or Redis: worth retrying, never data errors.
#: Only connection-level failures: psycopg's ``OperationalError`` (connection refused or lost,
#: server shutting down, too many connections) and ``InterfaceError``, as SQLAlchemy wraps
#: them; a pool with no connection to give; Redis unreachable, timing out, loading its data
#: (``BusyLoadingError`` is a connection error), failing over or out of memory. A value
#: Postgres refuses (``DataError``, ``IntegrityError``) or one that cannot be encoded is not
#: an outage: retrying it changes nothing.
TRANSIENT = (
    OperationalError,
    InterfaceError,
    PoolTimeout,
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    OutOfMemoryError,
    OSError,
)

#: SQLSTATE class of the limits Postgres puts on one statement (``54``: statement too complex,
#: stack depth limit exceeded, too many arguments or columns). psycopg reports them as an
#: ``OperationalError``, as it does a lost connection; they are the statement's own fault.
PROGRAM_LIMIT_CLASS = "54"


def past_database_limit(error: BaseException) -> bool:
    """Whether Postgres refused the statement as past a limit of its own: a request too big or
    too deep, never an outage (retrying it changes nothing), though it is a ``TRANSIENT``."""
    cause = getattr(error, "orig", None) or error
    sqlstate = getattr(cause, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate.startswith(PROGRAM_LIMIT_CLASS)


#: ``persistently``: 0.1 s doubling to 5 s, each wait within ±20 %.
PERSISTENT_INITIAL = 0.1
PERSISTENT_CAP = 5.0
PERSISTENT_JITTER = (0.8, 1.2)


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
            if past_database_limit(error):
                raise
            delay = backoff_delay(
                failures, initial=PERSISTENT_INITIAL, cap=PERSISTENT_CAP, jitter=PERSISTENT_JITTER
            )
            failures += 1
            if loop.time() + delay > deadline:
                raise
            if failures == 1:
                log.warning("%s failed, retrying until it works: %r", what, error)
            await asyncio.sleep(delay)
