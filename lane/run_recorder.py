"""The record of a ``/run``, written after the caller has its answer.

Each finished run becomes a prediction row with ``source: "sync"`` and its usage record
(:func:`tracker.sync_runs.insert_sync_runs`), so it shows in the account's list and usage.
Nothing waits for the write: the caller was answered already, and a write that fails is
logged and counted (``lane_record_failures_total``), never raised.

:meth:`SyncRecorder.record` only appends to a list. The write starts ``linger`` seconds after
the first run of a batch (or at once when ``max_batch`` runs are waiting), so runs that end
close together share one statement, and a run's own write never competes with the requests
right behind it: writing each run as it ended cost an INSERT round trip on the event loop per
``/run``, about a tenth of the api's CPU under sequential calls. One write is in flight at a
time; runs that end meanwhile go into the next. A batch that fails is written again run by
run, so a bad row fails only its own record. At shutdown the waiting runs are written at once,
given a few seconds to land.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from tracker.sync_runs import SyncRun, insert_sync_runs

log = logging.getLogger(__name__)

#: Seconds a run's record waits for others to share its statement: far below any reader's
#: patience (the list and usage are read by people), far above a /run at low load.
LINGER = 0.05
MAX_BATCH = 256

Write = Callable[[list[SyncRun]], Awaitable[object]]


class SyncRecorder:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        linger: float = LINGER,
        max_batch: int = MAX_BATCH,
        write: Write | None = None,
    ) -> None:
        """``write`` replaces :func:`insert_sync_runs` on ``engine`` (tests)."""
        self._write: Write = write or (lambda runs: insert_sync_runs(engine, runs))
        self.linger = linger
        self.max_batch = max_batch
        self._waiting: list[SyncRun] = []
        self._timer: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        self._in_flight = 0
        self.recorded = 0
        self.failures = 0

    def record(self, run: SyncRun) -> None:
        """Write ``run`` in the background, with the runs that end close to it."""
        self._waiting.append(run)
        if self._writer is not None:
            return  # the writer in flight takes it next
        if len(self._waiting) >= self.max_batch:
            self._start()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.linger, self._start)

    @property
    def pending(self) -> int:
        """Runs not written yet (waiting, or in the write in flight)."""
        return len(self._waiting) + self._in_flight

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writer is None and self._waiting:
            self._writer = asyncio.create_task(self._write_waiting())

    async def _write_waiting(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[: self.max_batch]
                del self._waiting[: self.max_batch]
                self._in_flight = len(batch)
                await self._write_batch(batch)
        finally:
            self._writer = None
            self._in_flight = 0

    async def _write_batch(self, batch: list[SyncRun]) -> None:
        try:
            await self._write(batch)
        except Exception:
            if len(batch) > 1:
                for run in batch:  # one bad row must not lose its neighbours' records
                    await self._write_batch([run])
                return
            self.failures += 1
            log.exception("the record of run %s was not written", batch[0].id)
        else:
            self.recorded += len(batch)

    async def close(self, timeout: float = 5.0) -> None:
        """Write what waits now (for up to ``timeout`` seconds), then drop the rest."""
        self._start()
        writer = self._writer
        if writer is None:
            return
        _, late = await asyncio.wait({writer}, timeout=timeout)
        if late:
            log.warning("lane: %d run record(s) dropped at shutdown", self.pending)
            writer.cancel()
