"""The reconciler: every unfinished prediction must be in some stream, or be re-enqueued.

Two holes it closes. The api commits a prediction and dies before its XADD; Redis restarts
without its data (every stream and consumer group gone). Each pass, one director per target
(a Redis lock) lists the target's unfinished predictions older than ``reconcile_after`` and
re-enqueues those found in none of its streams. A ``processing`` one is re-enqueued only when
its director shows no sign of life or does not name it among its runs (a director restarted
under the same name after Redis lost its data); re-enqueuing is safe anyway: a director that
reads the copy of a prediction a live director runs acknowledges it and changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from director.metrics import DirectorMetrics
from director.queue import Queue
from director.settings import DirectorSettings
from tracker import keys
from tracker.keys import Target
from tracker.states import UNFINISHED, Status, sql_list

log = logging.getLogger(__name__)

_CANDIDATES = text(
    f"""
    SELECT id, account_id, status, claim_owner FROM predictions
    WHERE target = :target AND status IN {sql_list(UNFINISHED)}
      AND created_at < now() - make_interval(secs => :age)
    ORDER BY created_at
    LIMIT 10000
    """
)


_STILL_UNFINISHED = text(
    f"SELECT id FROM predictions WHERE id = ANY(:ids) AND status IN {sql_list(UNFINISHED)}"
)


class Reconciler:
    def __init__(
        self,
        settings: DirectorSettings,
        engine: AsyncEngine,
        queue: Queue,
        targets: Sequence[Target],
        streams: Callable[[], list[str]],
        consumer: str,
        metrics: DirectorMetrics,
    ) -> None:
        """``streams``: the input streams the director reads now (current and draining)."""
        self.settings = settings
        self.engine = engine
        self.queue = queue
        self.redis = queue.redis
        self.targets = targets
        self.streams = streams
        self.consumer = consumer
        self.metrics = metrics

    async def _redis_epoch_age(self) -> float:
        """Seconds since this Redis's data began (a restart without data starts a new epoch)."""
        now = time.time()
        created = await self.redis.set(keys.EPOCH_KEY, str(now), nx=True)
        if created:
            # INFO: every first start meets a fresh Redis. A Redis that lost its data is told
            # by the warning of what it lost (predictions re-enqueued, below).
            log.info(
                "Redis holds no queue state yet (a new Redis, or one that lost its data): "
                "setting up the queues; predictions missing from them will be re-enqueued"
            )
            await self.queue.ensure_groups(self.streams())
            return 0.0
        value = await self.redis.get(keys.EPOCH_KEY)
        return now - float(value or now)

    async def pass_once(self) -> int:
        epoch_age = await self._redis_epoch_age()
        # After a data loss, directors' liveness keys are gone until their next heartbeat.
        liveness_known = epoch_age > max(self.settings.heartbeat_every * 3, 5)
        requeued = 0
        for target in self.targets:
            ttl_ms = int(self.settings.reconcile_interval * 1000)
            lock = target.reconcile_lock
            if not await self.redis.set(lock, self.consumer, nx=True, px=ttl_ms):
                continue
            requeued += await self._reconcile(target, liveness_known)
        return requeued

    async def _reconcile(self, target: Target, liveness_known: bool) -> int:
        params = {"target": target.name, "age": self.settings.reconcile_after}
        async with self.engine.connect() as conn:
            candidates = (await conn.execute(_CANDIDATES, params)).all()
        if not candidates:
            return 0
        present = await self._queued_ids(target)
        missing = [c for c in candidates if c[0] not in present]
        if not missing:
            return 0
        # Some may have finished (and left the stream) between the query and the scan.
        async with self.engine.connect() as conn:
            ids = [c[0] for c in missing]
            unfinished = set((await conn.execute(_STILL_UNFINISHED, {"ids": ids})).scalars())
        requeued = 0
        for prediction_id, account_id, status, owner in missing:
            pid = prediction_id
            if prediction_id not in unfinished:
                continue
            running = status == Status.PROCESSING.value
            if running and (not liveness_known or await self._runs(owner, pid)):
                continue
            await self.queue.enqueue(target.streams_for(account_id), prediction_id, account_id)
            requeued += 1
        if requeued:
            self.metrics.reenqueued.inc(requeued)
            log.warning("re-enqueued %d predictions missing from %s streams", requeued, target.key)
        return requeued

    async def _runs(self, owner: str | None, prediction_id: str) -> bool:
        """Whether ``owner`` is alive and was running the prediction at its last heartbeat (a
        director restarted under the same name is alive but runs nothing it lost)."""
        if owner is None:
            return False
        running = await self.queue.running_on(owner)
        return running is not None and prediction_id in running

    async def _queued_ids(self, target: Target) -> set[str]:
        ids: set[str] = set()
        for stream in (s for s in self.streams() if target.owns(s)):
            entries: Any = await self.redis.xrange(stream, "-", "+")
            ids.update(
                (fields[b"id"]).decode() for _, fields in entries if fields and b"id" in fields
            )
        return ids
