"""A director's periodic work beside its read loop: heartbeats, reclaiming, stream upkeep.

- Heartbeat: marks the director alive (``director:alive:<id>``) and refreshes the idle time of
  the entries it runs; an entry found pending for another director means this one was
  presumed dead and its work reclaimed, so that prediction is dropped here.
- Claimer: takes over entries idle past the visibility timeout (their director died or hangs),
  removes long-idle consumers with nothing pending, retires drained streams of an old layout,
  and exports queue length and pending count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.exceptions import RedisError

from director import metrics
from director.director import Director
from director.queue import alive_key

log = logging.getLogger(__name__)


class Maintenance:
    def __init__(self, director: Director) -> None:
        self.director = director
        self.settings = director.settings
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._every(self.settings.heartbeat_every, self.heartbeat)),
            asyncio.create_task(self._every(self.settings.claim_interval, self.claim)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _every(self, seconds: float, work: object) -> None:
        assert callable(work)
        while True:
            try:
                await work()
            except (RedisError, OSError) as error:
                log.debug("%s skipped: %r", getattr(work, "__name__", work), error)
            await asyncio.sleep(seconds)

    async def heartbeat(self) -> None:
        director = self.director
        ttl_ms = int(max(self.settings.heartbeat_every * 3, 5) * 1000)
        await director.redis.set(alive_key(director.consumer), "1", px=ttl_ms)
        entries = [(entry.stream, entry.id) for entry in director.inflight.values()]
        metrics.INFLIGHT.set(len(entries))
        if not entries:
            return
        for _stream, entry_id in await director.reclaimer.heartbeat(entries):
            entry = director.inflight.get(entry_id)
            target = director.receiver.inflight.get(entry.prediction_id) if entry else None
            if target is not None:
                target.lost = True

    async def claim(self) -> None:
        director = self.director
        min_idle_ms = int(self.settings.visibility_timeout * 1000)
        for stream in director.all_streams:
            free = director.has_capacity()
            if free <= 0:
                break
            claimed = await director.reclaimer.autoclaim(stream, min_idle_ms, free)
            if claimed:
                log.info("reclaimed %d entries from %s", len(claimed), stream)
                metrics.RECLAIMED.inc(len(claimed))
                director.add_entries(claimed)
        for stats in await director.reclaimer.stats(director.all_streams):
            metrics.QUEUE_LENGTH.labels(stats.stream).set(stats.length)
            metrics.QUEUE_PENDING.labels(stats.stream).set(stats.pending)
            if stats.stream in director.draining and stats.length == 0 and stats.pending == 0:
                director.draining.remove(stats.stream)
                log.info("stream %s drained; no longer read", stats.stream)
        for stream in director.all_streams:
            await director.reclaimer.forget_dead_consumers(stream, min_idle_ms * 10)
