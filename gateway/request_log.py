"""Writing the request log (:mod:`blocks.request_log`) off the hot path.

A call's entry goes into a bounded in-memory queue (``log_queue`` entries) and the call goes
on: inference never waits on the log. One task takes what is queued, up to ``log_batch`` at a
time (waiting at most ``log_flush_interval`` to fill a batch), and writes it with one ``COPY``.
A full queue drops the entry (``queue_full``); a batch that cannot be written because the
database is away (or a partition is missing twice) is dropped (``write_failed``). A batch the
database refuses for what it holds (an entry whose value it cannot take) is split in halves
and each written again, down to single entries: only the entries refused on their own are
dropped (``refused``), their neighbours kept. Each is counted
(``conduit_gateway_log_dropped_total`` by reason) and logged once per stretch of failures.
Every hour (and at start) the coming days' partitions are made and those past
``log_retention_days`` retired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime

import psycopg
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks.request_log import LogEntry, NoPartition, copy_entries, maintain_partitions
from core.periodic import Periodic
from core.transient import TRANSIENT, past_database_limit

log = logging.getLogger(__name__)

#: Days of partitions made ahead of today.
DAYS_AHEAD = 2
MAINTENANCE_INTERVAL = 3600.0


class RequestLogWriter:
    def __init__(
        self,
        engine: AsyncEngine,
        queue_size: int = 10_000,
        batch: int = 1000,
        flush_interval: float = 0.25,
        retention_days: int = 7,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.engine = engine
        self.batch = batch
        self.flush_interval = flush_interval
        self.retention_days = retention_days
        self.registry = registry or CollectorRegistry()
        self.dropped = Counter(
            "conduit_gateway_log_dropped_total",
            "Request log entries not written: queue_full, write_failed or refused.",
            ["reason"],
            registry=self.registry,
        )
        self.written = Counter(
            "conduit_gateway_log_rows_total",
            "Request log entries written.",
            registry=self.registry,
        )
        self._queue: asyncio.Queue[LogEntry] = asyncio.Queue(queue_size)
        self._task: asyncio.Task[None] | None = None
        self._maintenance = Periodic(
            "request log partitions",
            MAINTENANCE_INTERVAL,
            self.maintain,
            "request log partition maintenance",
            log,
            TRANSIENT,
        )
        self._failing = False

    def record(self, entry: LogEntry) -> None:
        """Queue ``entry`` (never waits; a full queue drops it, counted)."""
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            self.dropped.labels("queue_full").inc()

    async def start(self) -> None:
        self._maintenance.start(at_once=True)
        self._task = asyncio.create_task(self._run(), name="request log writer")

    async def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most ``timeout`` seconds), then stop."""
        await self._maintenance.stop()
        task, self._task = self._task, None
        if task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def maintain(self) -> None:
        created, dropped = await maintain_partitions(
            self.engine, datetime.now(UTC).date(), DAYS_AHEAD, self.retention_days
        )
        if created or dropped:
            log.info("request log partitions: created %s, dropped %s", created, dropped)

    async def _run(self) -> None:
        while True:
            entries = [await self._queue.get()]
            until = time.monotonic() + self.flush_interval
            while len(entries) < self.batch:
                left = until - time.monotonic()
                if left <= 0:
                    break
                try:
                    entries.append(await asyncio.wait_for(self._queue.get(), left))
                except TimeoutError:
                    break
            try:
                await self._write(entries)
            finally:
                for _ in entries:
                    self._queue.task_done()

    async def _write(self, entries: list[LogEntry]) -> None:
        try:
            await self._copy(entries)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # whatever the database says, inference goes on
            if _entries_at_fault(error):
                await self._split(entries, error)
                return
            self.dropped.labels("write_failed").inc(len(entries))
            if not self._failing:
                log.warning("request log: %d entries not written: %r", len(entries), error)
            self._failing = True
            return
        self._wrote(len(entries))

    async def _copy(self, entries: list[LogEntry]) -> None:
        try:
            await copy_entries(self.engine, entries)
        except NoPartition:
            await self.maintain()  # a day the partitions do not reach yet
            await copy_entries(self.engine, entries)

    async def _split(self, entries: list[LogEntry], error: Exception) -> None:
        """Write ``entries`` (refused as a whole for ``error``) in halves, down to the ones
        refused on their own, which are dropped."""
        if len(entries) == 1:
            self.dropped.labels("refused").inc()
            log.warning("request log: an entry refused: %s", _short(error))
            return
        middle = len(entries) // 2
        for half in (entries[:middle], entries[middle:]):
            await self._write(half)

    def _wrote(self, count: int) -> None:
        self.written.inc(count)
        if self._failing:
            log.info("request log written again")
            self._failing = False


def _entries_at_fault(error: Exception) -> bool:
    """Whether the database refused what a batch holds (a value it cannot take, a row past a
    limit of its own), not a connection, a pool or a server going away."""
    if past_database_limit(error):
        return True
    outage = (NoPartition, psycopg.OperationalError, psycopg.InterfaceError, *TRANSIENT)
    return not isinstance(error, outage)


def _short(error: Exception) -> str:
    text = str(error)
    return text if len(text) <= 200 else f"{text[:200]}..."
