"""A director's periodic work beside its read loop: heartbeats, reclaiming, stream upkeep.

- Heartbeat: marks the director alive (``director:alive:<id>``) and refreshes the idle time of
  the entries it runs. An entry found pending for another director means this one was
  presumed dead and its work reclaimed; one pending for nobody was acknowledged by whoever
  finished it (or lost with Redis's data), and Postgres tells which: if the prediction's
  attempt is no longer this one's, another director took over. Either way the attempt is
  dropped here and publishes nothing more. The alive key lives no longer than the visibility
  timeout, so by the time an entry can be reclaimed its director no longer looks alive.
- Claimer: takes over entries idle past the visibility timeout (their director died or hangs),
  removes long-idle consumers with nothing pending, retires drained streams of an old layout,
  and exports queue length and pending count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import orjson
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError

from director import metrics
from director.director import Director
from director.queue import alive_key
from tracker import store

log = logging.getLogger(__name__)


class Maintenance:
    def __init__(self, director: Director) -> None:
        self.director = director
        self.settings = director.settings
        self._tasks: list[asyncio.Task[None]] = []
        self._beat: asyncio.Future[None] | None = None

    def start(self) -> None:
        self.director.renew_lease = self.renew
        self._tasks = [
            asyncio.create_task(self._every(self.settings.heartbeat_every, self.renew)),
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
            except (RedisError, DBAPIError, OSError) as error:
                log.debug("%s skipped: %r", getattr(work, "__name__", work), error)
            await asyncio.sleep(seconds)

    async def renew(self) -> None:
        """Heartbeat now, or wait for the heartbeat already under way."""
        if self._beat is None or self._beat.done():
            self._beat = asyncio.ensure_future(self.heartbeat())
        await asyncio.shield(self._beat)

    async def heartbeat(self) -> None:
        director = self.director
        began = asyncio.get_running_loop().time()
        settings = self.settings
        ttl = min(max(settings.heartbeat_every * 3, 5), settings.visibility_timeout)
        entries = [(entry.stream, entry.id) for entry in director.inflight.values()]
        # The key's value names what runs here: after Redis lost its data, a restarted director
        # under the same name is alive, yet runs none of its predecessor's predictions.
        running = orjson.dumps(sorted({e.prediction_id for e in director.inflight.values()}))
        await director.redis.set(alive_key(director.consumer), running, px=int(ttl * 1000))
        metrics.INFLIGHT.set(len(entries))
        if not entries:
            director.lease_renewed = began
            return
        beat = await director.reclaimer.heartbeat(entries)
        for key in beat.lost:
            director.mark_lost(key, "another director holds its queue entry")
        for key in beat.unowned:
            await self._check_attempt(key)
        director.lease_renewed = began

    async def _check_attempt(self, key: tuple[str, str]) -> None:
        """An entry pending for nobody: the run is still this director's only if the
        prediction's attempt in Postgres is still the one it claimed."""
        director = self.director
        entry = director.inflight.get(key)
        target = director.receiver.inflight.get(entry.prediction_id) if entry else None
        if entry is None or target is None or target.attempt is None:
            return  # not claimed yet, or already over
        row = await store.get(director.engine, entry.prediction_id)
        if row is None or row["attempt"] != target.attempt:
            director.mark_lost(key, "another attempt took it over")

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
