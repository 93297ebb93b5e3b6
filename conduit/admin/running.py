"""How an admin command reaches the database and Redis: each opens what it needs, does one
thing and closes it; a catalogue change is then announced to every process's cache."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from catalog.rules import OPERATOR
from conduit.runtime import database_url, run_async

T = TypeVar("T")

# ``OPERATOR`` (from ``catalog.rules``) is who the CLI acts as: the admin principal of every
# catalogue write and read it makes, which sees and manages what every account owns, by the
# rules the API's accounts follow.
__all__ = ["OPERATOR", "announce_catalog_change", "with_engine", "with_redis"]


def with_engine(work: Callable[[Any], Awaitable[T]], *, catalog_change: bool = False) -> T:
    """Run ``work`` on the database; with ``catalog_change``, then tell every process's
    catalogue cache (over Redis) that what they cached changed."""
    from tracker.db import make_engine

    async def main() -> T:
        engine = make_engine(database_url(), pool_size=2)
        try:
            done = await work(engine)
        finally:
            await engine.dispose()
        if catalog_change:
            await announce_catalog_change()
        return done

    return run_async(main())


def with_redis(work: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``work`` on Redis (``REDIS_URL``)."""
    from api.settings import ApiSettings
    from tracker.redis_connect import connect

    async def main() -> T:
        redis = connect(ApiSettings().redis_url)
        try:
            return await work(redis)
        finally:
            await redis.aclose()

    return run_async(main())


async def announce_catalog_change() -> None:
    from api.settings import ApiSettings
    from catalog.generation import CatalogGeneration
    from tracker.redis_connect import connect

    redis = connect(ApiSettings().redis_url)
    try:
        await CatalogGeneration(redis).bump()
    finally:
        await redis.aclose()
