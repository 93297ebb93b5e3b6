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

import asyncio
import logging
import time
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from director import metrics
from director.director import Director
from director.queue import Target, reconcile_lock_key

log = logging.getLogger(__name__)

EPOCH_KEY = "conduit:epoch"
_CANDIDATES = text(
    """
    SELECT id, account_id, status, claim_owner FROM predictions
    WHERE stream = :target AND status IN ('starting', 'processing')
      AND created_at < now() - make_interval(secs => :age)
    ORDER BY created_at
    LIMIT 10000
    """
)


_STILL_UNFINISHED = text(
    "SELECT id FROM predictions WHERE id = ANY(:ids) AND status IN ('starting', 'processing')"
)


class Reconciler:
    def __init__(self, director: Director) -> None:
        self.director = director
        self.settings = director.settings

    async def run_forever(self) -> None:
        while True:
            try:
                await self.pass_once()
            except (RedisError, DBAPIError, OSError) as error:
                log.debug("reconciler pass skipped: %r", error)
            await asyncio.sleep(self.settings.reconcile_interval)

    async def _redis_epoch_age(self) -> float:
        """Seconds since this Redis's data began (a restart without data starts a new epoch)."""
        redis = self.director.redis
        now = time.time()
        created = await redis.set(EPOCH_KEY, str(now), nx=True)
        if created:
            log.warning("Redis has no epoch marker: new or emptied; rebuilding queue state")
            await self.director.queue.ensure_groups(self.director.all_streams)
            return 0.0
        value = await redis.get(EPOCH_KEY)
        return now - float(value or now)

    async def pass_once(self) -> int:
        epoch_age = await self._redis_epoch_age()
        # After a data loss, directors' liveness keys are gone until their next heartbeat.
        liveness_known = epoch_age > max(self.settings.heartbeat_every * 3, 5)
        requeued = 0
        for target in self.director.deployment.targets:
            lock = reconcile_lock_key(f"{target.kind}-{target.key}")
            ttl_ms = int(self.settings.reconcile_interval * 1000)
            if not await self.director.redis.set(lock, self.director.consumer, nx=True, px=ttl_ms):
                continue
            requeued += await self._reconcile(target, liveness_known)
        return requeued

    async def _reconcile(self, target: Target, liveness_known: bool) -> int:
        params = {"target": f"{target.kind}-{target.key}", "age": self.settings.reconcile_after}
        async with self.director.engine.connect() as conn:
            candidates = (await conn.execute(_CANDIDATES, params)).all()
        if not candidates:
            return 0
        present = await self._queued_ids(target)
        missing = [c for c in candidates if c[0] not in present]
        if not missing:
            return 0
        # Some may have finished (and left the stream) between the query and the scan.
        async with self.director.engine.connect() as conn:
            ids = [c[0] for c in missing]
            unfinished = set((await conn.execute(_STILL_UNFINISHED, {"ids": ids})).scalars())
        requeued = 0
        for prediction_id, account_id, status, owner in missing:
            pid = prediction_id
            if prediction_id not in unfinished:
                continue
            if status == "processing" and (not liveness_known or await self._runs(owner, pid)):
                continue
            await self.director.queue.enqueue(target.streams_for(account_id), prediction_id)
            requeued += 1
        if requeued:
            metrics.REENQUEUED.inc(requeued)
            log.warning("re-enqueued %d predictions missing from %s streams", requeued, target.key)
        return requeued

    async def _runs(self, owner: str | None, prediction_id: str) -> bool:
        """Whether ``owner`` is alive and was running the prediction at its last heartbeat (a
        director restarted under the same name is alive but runs nothing it lost)."""
        if owner is None:
            return False
        running = await self.director.queue.running_on(owner)
        return running is not None and prediction_id in running

    async def _queued_ids(self, target: Target) -> set[str]:
        prefix = target.stream(0).rsplit(":", 1)[0] + ":"
        streams = [s for s in self.director.all_streams if s.startswith(prefix)]
        ids: set[str] = set()
        for stream in streams:
            entries: Any = await self.director.redis.xrange(stream, "-", "+")
            ids.update(
                (fields[b"id"]).decode() for _, fields in entries if fields and b"id" in fields
            )
        return ids
