"""Leases: a director's hold on the attempts it runs, kept by heartbeats, taken over when dead.

- ``Lease``: the one ownership fence of one attempt, passed to everything that publishes for
  it. Lost when a heartbeat finds the attempt's queue entry pending for another director (this
  one was presumed dead and its work reclaimed), or pending for nobody while Postgres shows a
  newer attempt, or when a fenced write finds another attempt in charge. A lease not renewed
  for half the visibility timeout (the director stalled) is renewed before the next publish.
- ``Heartbeats``: marks the director alive (``director:alive:<id>``, naming what it runs) and
  refreshes the idle time of the entries it runs. The alive key lives no longer than the
  visibility timeout, so by the time an entry can be reclaimed its director no longer looks
  alive.
- ``Takeover``: takes over entries idle past the visibility timeout (their director died or
  hangs), removes long-idle consumers with nothing pending, retires drained streams of an old
  layout, and exports queue length and pending count.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import orjson
from redis.asyncio import Redis

from core.transient import TRANSIENT
from director.metrics import DirectorMetrics
from director.queue import Entry
from director.reclaim import Reclaimer
from tracker.keys import alive_key
from tracker.ledger import Ledger

if TYPE_CHECKING:
    from director.attempts import Attempts

log = logging.getLogger(__name__)


class Lease:
    """One attempt's hold on its prediction (a ``tracker.fence.Fence``)."""

    def __init__(self, prediction_id: str, keeper: Heartbeats | None = None) -> None:
        """Without a ``keeper`` (no heartbeats) the lease is lost only by ``revoke``."""
        self.prediction_id = prediction_id
        self.keeper = keeper
        #: The attempt number the claim gave it; None until claimed.
        self.attempt: int | None = None
        self._lost = False

    @property
    def lost(self) -> bool:
        return self._lost

    def revoke(self, why: str) -> None:
        if self._lost:
            return
        self._lost = True
        pid = self.prediction_id
        log.warning("attempt %s of %s no longer owns it (%s): stopping", self.attempt, pid, why)

    async def held(self) -> bool:
        """Renews a stale hold first. With Redis or Postgres away it cannot be renewed; the
        answer is then what is known (publishing fails by itself without Redis, and every
        state write stays fenced in Postgres): an outage never fails the run."""
        if not self._lost and self.keeper is not None:
            try:
                await self.keeper.renew_if_stale()
            except TRANSIENT as error:
                log.debug("lease of %s not renewed: %r", self.prediction_id, error)
        return not self._lost


class Heartbeats:
    def __init__(
        self,
        redis: Redis,
        reclaimer: Reclaimer,
        ledger: Ledger,
        attempts: Attempts,
        metrics: DirectorMetrics,
        *,
        interval: float,
        visibility_timeout: float,
    ) -> None:
        self.redis = redis
        self.reclaimer = reclaimer
        self.ledger = ledger
        self.attempts = attempts
        self.metrics = metrics
        self.interval = interval
        self.visibility_timeout = visibility_timeout
        #: Loop time of the last heartbeat that found this director's entries still its own.
        self.renewed_at = float("-inf")
        self._beat: asyncio.Future[None] | None = None

    def lease(self, prediction_id: str) -> Lease:
        return Lease(prediction_id, self)

    async def renew_if_stale(self) -> None:
        """After a stall (no heartbeat for half the visibility timeout) another director may
        have taken over: heartbeat before publishing."""
        if asyncio.get_running_loop().time() - self.renewed_at > self.visibility_timeout / 2:
            await self.renew()

    async def renew(self) -> None:
        """Heartbeat now, or wait for the heartbeat already under way."""
        if self._beat is None or self._beat.done():
            self._beat = asyncio.ensure_future(self.heartbeat())
        await asyncio.shield(self._beat)

    async def heartbeat(self) -> None:
        began = asyncio.get_running_loop().time()
        ttl = min(max(self.interval * 3, 5), self.visibility_timeout)
        running = self.attempts.running()
        # The key's value names what runs here: after Redis lost its data, a restarted director
        # under the same name is alive, yet runs none of its predecessor's predictions.
        names = orjson.dumps(sorted({a.prediction_id for a in running}))
        await self.redis.set(alive_key(self.reclaimer.consumer), names, px=int(ttl * 1000))
        self.metrics.inflight.set(len(running))
        if running:
            beat = await self.reclaimer.heartbeat([a.entry.key for a in running])
            for key in beat.lost:
                self._revoke(key, "another director holds its queue entry")
            for key in beat.unowned:
                await self._check_attempt(key)
        self.renewed_at = began

    def _revoke(self, key: tuple[str, str], why: str) -> None:
        attempt = self.attempts.get(key)
        if attempt is not None:
            attempt.lease.revoke(why)

    async def _check_attempt(self, key: tuple[str, str]) -> None:
        """An entry pending for nobody: the run is still this director's only if the
        prediction's attempt in Postgres is still the one it claimed."""
        attempt = self.attempts.get(key)
        if attempt is None or attempt.lease.attempt is None:
            return  # not claimed yet, or already over
        row = await self.ledger.row(attempt.prediction_id)
        if row is None or row["attempt"] != attempt.lease.attempt:
            attempt.lease.revoke("another attempt took it over")


class EntrySource(Protocol):
    """The part of a director's intake the takeover needs: the streams it reads, and a way in
    for entries taken over."""

    @property
    def streams(self) -> list[str]: ...

    def is_draining(self, stream: str) -> bool: ...

    def retire(self, stream: str) -> None: ...

    def offer(self, entries: Sequence[Entry]) -> None: ...


class Takeover:
    def __init__(
        self,
        reclaimer: Reclaimer,
        intake: EntrySource,
        free: Callable[[], int],
        idle_ms: int,
        metrics: DirectorMetrics,
    ) -> None:
        self.reclaimer = reclaimer
        self.intake = intake
        self.free = free
        self.idle_ms = idle_ms
        self.metrics = metrics

    async def claim(self) -> None:
        for stream in self.intake.streams:
            free = self.free()
            if free <= 0:
                break
            claimed = await self.reclaimer.autoclaim(stream, self.idle_ms, free)
            if claimed:
                log.info("reclaimed %d entries from %s", len(claimed), stream)
                self.metrics.reclaimed.inc(len(claimed))
                self.intake.offer(claimed)
        for stats in await self.reclaimer.queue.stats(self.intake.streams):
            self.metrics.queue_length.labels(stats.stream).set(stats.length)
            self.metrics.queue_pending.labels(stats.stream).set(stats.pending)
            if self.intake.is_draining(stats.stream) and stats.length == stats.pending == 0:
                self.intake.retire(stats.stream)
        for stream in self.intake.streams:
            await self.reclaimer.forget_dead_consumers(stream, self.idle_ms * 10)
