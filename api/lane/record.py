"""The record of a ``/run``, written after the caller has its answer.

Each finished run becomes a prediction row with ``source: "sync"`` and its usage record
(:func:`tracker.batch_writes.insert_sync_runs`), so it shows in the account's list and usage.
Writes go through one :class:`~tracker.group_commit.Batcher`: runs that end together share a
statement. Nothing waits for them: the caller was answered already, and a write that fails is
logged and counted (``lane_record_failures_total``), never raised. At shutdown the pending
writes are given a few seconds to land.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from tracker.batch_writes import SyncRun, insert_sync_runs
from tracker.group_commit import Batcher

log = logging.getLogger(__name__)


class SyncRecorder:
    def __init__(self, engine: AsyncEngine) -> None:
        self._batcher: Batcher[SyncRun, None] = Batcher(functools.partial(insert_sync_runs, engine))
        self._pending: set[asyncio.Task[None]] = set()
        self.recorded = 0
        self.failures = 0

    def record(self, run: SyncRun) -> None:
        """Write ``run`` in the background."""
        task = asyncio.create_task(self._write(run))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _write(self, run: SyncRun) -> None:
        try:
            await self._batcher.submit(run)
        except Exception:
            self.failures += 1
            log.exception("the record of run %s was not written", run.id)
        else:
            self.recorded += 1

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def close(self, timeout: float = 5.0) -> None:
        """Let the writes in flight land (for up to ``timeout`` seconds), then drop the rest."""
        pending = set(self._pending)
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            log.warning("lane: %d run record(s) dropped at shutdown", len(late))
        await self._batcher.close()
