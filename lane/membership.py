"""Which api replicas share the lane: a sorted set in Redis (``tracker.keys.LANE_MEMBERS``)
of replica ids scored by their latest heartbeat (epoch ms).

Each replica heartbeats every ``interval`` seconds: one pipeline writes its own score, prunes
members older than ``ttl`` and reads who is left. When that set changes, ``on_change`` gets it
(sorted), and the lane recomputes its slices of every runner's permits
(:mod:`lane.slices`). Requests never touch Redis: they read the last list. While Redis is
away the last list is kept (a runner's refusal corrects an overlap meanwhile). A replica that
stops removes itself; one that dies is pruned by the others ``ttl`` later.

Scores come from each replica's own clock: clocks that drift apart by more than ``ttl`` minus
``interval`` make a live member look expired to the others (and it re-joins at its next
heartbeat).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis.asyncio import Redis

from core.periodic import Periodic
from core.transient import TRANSIENT
from tracker.keys import LANE_MEMBERS
from tracker.redis_connect import decoded

log = logging.getLogger(__name__)


class Membership:
    def __init__(
        self,
        redis: Redis,
        me: str,
        on_change: Callable[[tuple[str, ...]], None],
        interval: float = 1.0,
        ttl: float = 3.0,
    ) -> None:
        self.redis = redis
        self.me = me
        self.on_change = on_change
        self.interval = interval
        self.ttl = ttl
        #: The members as last read, sorted; this replica alone before the first read.
        self.members: tuple[str, ...] = (me,)
        self._beats = Periodic(
            "lane-membership", interval, self.beat, "lane heartbeat", log, TRANSIENT
        )

    async def beat(self) -> tuple[str, ...]:
        """Heartbeat, prune and read, in one round trip; the members, sorted."""
        now_ms = round(time.time() * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(LANE_MEMBERS, {self.me: now_ms})
            pipe.zremrangebyscore(LANE_MEMBERS, "-inf", f"({now_ms - round(self.ttl * 1000)}")
            pipe.zrange(LANE_MEMBERS, 0, -1)
            *_, raw = await pipe.execute()
        members = tuple(sorted({decoded(m) for m in raw} | {self.me}))
        if members != self.members:
            log.info("lane: %d api replica(s) share the runners: %s", len(members), members)
            self.members = members
            self.on_change(members)
        return members

    async def start(self) -> None:
        """Join now (a failure is logged: the lane runs alone until Redis answers), then
        heartbeat in the background until :meth:`stop`."""
        await self._beats.step_logged()
        self._beats.start()

    async def stop(self) -> None:
        """Leave: the others take over this replica's slices at their next heartbeat."""
        await self._beats.stop()
        try:
            await self.redis.zrem(LANE_MEMBERS, self.me)
        except TRANSIENT as error:
            log.info("lane: left without a word (%r); pruned in %g s", error, self.ttl)
