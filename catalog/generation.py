"""Read-your-writes for the catalogue caches of every process: a generation counter in Redis.

Each process caches models, versions, deployments and grants (``catalog.cache``) for
``CONDUIT_API_CACHE_TTL`` seconds. Every writer of the catalogue (the api's management routes,
a director that makes a trained version, ``conduit admin``) bumps the counter once its change
is committed; every cached read first reads the counter (one GET) and reloads an entry cached
under an older one. A write answered by one process is then seen by the next read in any
other, not a TTL later; the TTL still bounds a change whose bump was lost.

Concurrent reads share one GET: a read that arrives while a GET is in flight waits for the
next one, sent once the one in flight has answered (that GET started before this read did, so
it may predate a bump this read must see). A busy api then sends one GET per round trip rather
than one per create, and read-your-writes holds as with a GET of its own.

While Redis does not answer, reads serve the cache by its TTL alone (the check is skipped for
``RETRY_AFTER`` seconds after a failure, so an outage costs no read more than one timeout).
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.asyncio import Redis

from core.transient import TRANSIENT
from tracker.keys import CATALOG_GENERATION_KEY

log = logging.getLogger(__name__)

#: Seconds the counter is not read after a failed read (the TTL alone holds meanwhile).
RETRY_AFTER = 1.0


class CatalogGeneration:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._failed_at = float("-inf")
        #: The GET in flight, and the one the reads arriving meanwhile wait for.
        self._in_flight: asyncio.Future[int | None] | None = None
        self._next: asyncio.Future[int | None] | None = None

    async def current(self) -> int | None:
        """The counter now, as a GET sent after this call began reads it; None while Redis
        does not answer (serve by TTL)."""
        if time.monotonic() - self._failed_at < RETRY_AFTER:
            return None
        in_flight = self._in_flight
        # A GET of another (closed) event loop never answers here: start afresh.
        if (
            in_flight is None
            or in_flight.done()
            or in_flight.get_loop() is not asyncio.get_running_loop()
        ):
            self._in_flight, self._next = asyncio.ensure_future(self._read()), None
            return await asyncio.shield(self._in_flight)
        if self._next is None:
            self._next = asyncio.ensure_future(self._read_after(in_flight))
        return await asyncio.shield(self._next)

    async def _read_after(self, in_flight: asyncio.Future[int | None]) -> int | None:
        await asyncio.wait([in_flight])
        if time.monotonic() - self._failed_at < RETRY_AFTER:
            return None  # that one failed: serve by TTL, no second timeout
        this = asyncio.current_task()
        if self._next is this:  # (a read that found nothing in flight may have gone ahead)
            # Now the one in flight: reads arriving from here on wait for the one after.
            self._in_flight, self._next = this, None
        return await self._read()

    async def _read(self) -> int | None:
        try:
            value = await self.redis.get(CATALOG_GENERATION_KEY)
        except TRANSIENT as error:
            self._failed_at = time.monotonic()
            log.info("catalogue generation unread (caches serve by TTL): %r", error)
            return None
        return int(value or 0)

    async def bump(self) -> None:
        """Say the catalogue changed (after the change is committed). A lost bump is logged:
        other processes then see the change within their cache's TTL."""
        try:
            await self.redis.incr(CATALOG_GENERATION_KEY)
        except TRANSIENT as error:
            log.warning("catalogue change not announced (seen within the cache TTL): %r", error)
