"""The director: read a queue entry, claim its prediction, drive the runner, record, ack.

One director runs beside one runner. It owns the read → claim → run → ack loop and nothing of
the public API. An entry is acknowledged only after its prediction's terminal state is
committed; any infrastructure failure (runner, Redis, Postgres unreachable) leaves the entry
pending, to be re-read by this director (every ``retry_interval``, once its backends answer
again, and at start) or reclaimed by another one (``director.maintenance``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from datetime import UTC, datetime

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError
from sqlalchemy import text
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from director import metrics
from director.backoff import StartBackoff
from director.deployment import DeploymentInfo
from director.execution import Execution
from director.outbound import Outbound
from director.queue import CANCEL_CHANNEL, Entry, Queue
from director.receiver import Inflight, Receiver
from director.reclaim import Reclaimer
from director.runner_client import RunnerClient, RunnerError
from director.runner_monitor import RunnerMonitor
from director.settings import DirectorSettings
from runners.protocol import HealthStatus
from tracker import store
from tracker.render import render_prediction
from tracker.states import Status
from tracker.tracker import AttemptTracker

log = logging.getLogger(__name__)

INFRASTRUCTURE_ERRORS = (RunnerError, DBAPIError, RedisError, OSError)
INTERRUPTED = (
    "prediction interrupted: its run was lost before it finished (the director or the runner "
    "running it stopped); it is safe to retry"
)


class Director:
    def __init__(
        self,
        settings: DirectorSettings,
        deployment: DeploymentInfo,
        engine: AsyncEngine,
        redis: Redis,
        runner: RunnerClient,
        receiver: Receiver,
        consumer: str,
        outbound: Outbound,
    ) -> None:
        self.settings = settings
        self.deployment = deployment
        self.engine = engine
        self.redis = redis
        self.queue = Queue(redis)
        self.reclaimer = Reclaimer(self.queue, consumer)
        self.runner = runner
        self.receiver = receiver
        self.consumer = consumer
        self.outbound = outbound
        self.monitor = RunnerMonitor(
            runner, settings.runner_check_interval, settings.runner_check_failures
        )
        self.backoff = StartBackoff(
            initial=settings.start_backoff_initial,
            max_delay=settings.start_backoff_max,
            max_retry_after=settings.retry_after_max,
            jitter=settings.retry_after_jitter,
        )
        self.streams = deployment.streams()
        self.draining = deployment.draining(
            settings.drain_shards, settings.drain_streams.split(",")
        )
        self.stopping = asyncio.Event()
        self.inflight: dict[str, Entry] = {}  # entry id -> entry being handled
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._backlog: collections.deque[Entry] = collections.deque()
        self._slot_freed = asyncio.Event()
        self._rotation = 0
        self._backend_trouble = False
        self.runner_suspect = False  # ignored a cancel: take no work until it is READY again

    @property
    def all_streams(self) -> list[str]:
        return self.streams + self.draining

    def has_capacity(self) -> int:
        return self.settings.concurrency - len(self._tasks) - len(self._backlog)

    def _handling(self, entry: Entry) -> bool:
        """Already running or waiting here, under this entry or another for the prediction."""
        return (
            entry.id in self._tasks
            or entry.prediction_id in self.receiver.inflight
            or any(
                e.id == entry.id or e.prediction_id == entry.prediction_id for e in self._backlog
            )
        )

    def add_entries(self, entries: list[Entry]) -> None:
        for entry in entries:
            if not self._handling(entry):
                self._backlog.append(entry)
        self._slot_freed.set()

    async def run(self) -> None:
        """Serve until ``stopping`` is set, then let in-flight predictions finish."""
        await self.queue.ensure_groups(self.all_streams)
        await self.monitor.check()  # learn the runner's hardware before the first prediction
        helpers = [
            asyncio.create_task(self._listen_for_cancels()),
            asyncio.create_task(self.monitor.run_forever()),
        ]
        try:
            await self._read_loop()
        finally:
            await self._drain()
            for task in helpers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_retry = 0.0
        failures = 0
        while not self.stopping.is_set():
            free = self.settings.concurrency - len(self._tasks)
            if free <= 0 or self.runner_suspect:
                await self._wait_for_slot()
                continue
            try:
                if loop.time() >= next_retry:
                    next_retry = loop.time() + self.settings.retry_interval
                    await self._reread_pending()
                if not self._backlog:
                    await self._read_new(free)
                failures = 0
            except ResponseError as error:
                if "NOGROUP" not in str(error):
                    raise
                log.warning("consumer group missing (Redis lost its data?): recreating")
                await self.queue.ensure_groups(self.all_streams)
            except INFRASTRUCTURE_ERRORS as error:
                failures += 1
                await self._back_off(failures, error)
                continue
            while self._backlog and len(self._tasks) < self.settings.concurrency:
                entry = self._backlog.popleft()
                if not self._handling(entry):  # a redelivery of what runs here waits its turn
                    self._spawn(entry)

    async def _back_off(self, failures: int, error: BaseException) -> None:
        # Exponential, capped; logged on the first failure and then rarely: no error storm.
        if failures == 1 or failures % 20 == 0:
            log.warning("queue unreachable (%d failures so far): %r", failures, error)
        await self._pause(min(0.25 * 2 ** min(failures, 5), 5.0))

    async def _wait_for_slot(self) -> None:
        self._slot_freed.clear()
        timeout = 1.0 if self.runner_suspect else None
        stop = asyncio.ensure_future(self.stopping.wait())
        slot = asyncio.ensure_future(self._slot_freed.wait())
        await asyncio.wait({stop, slot}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        slot.cancel()
        if self.runner_suspect and self.monitor.status is HealthStatus.READY:
            log.info("runner is READY again; taking work")
            self.runner_suspect = False

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _backends_answer(self) -> bool:
        try:
            await self.redis.ping()
            async with self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except INFRASTRUCTURE_ERRORS:
            return False
        return True

    async def _reread_pending(self) -> None:
        # Re-reading counts as a delivery: while Postgres or Redis is down, don't, or an outage
        # would push healthy predictions toward the dead-letter stream.
        if self._backend_trouble:
            if not await self._backends_answer():
                return
            self._backend_trouble = False
        if self.monitor.gone:
            return  # same for a runner that is away: wait until it answers again
        entries = await self.queue.read(
            self.all_streams,
            self.consumer,
            count=self.settings.concurrency * 4 + 16,
            block_ms=None,
            pending=True,
        )
        self.add_entries(entries)

    async def _read_new(self, free: int) -> None:
        """Non-blocking reads shard by shard, round robin, then one blocking read of all."""
        streams = self.all_streams
        start = self._rotation % len(streams)
        ordered = streams[start:] + streams[:start]
        for offset, stream in enumerate(ordered):
            got = await self.queue.read([stream], self.consumer, count=free, block_ms=None)
            if not got:
                continue
            # Round robin over the shards that have work: the next read starts after this one,
            # so a flooded shard is served once per turn, not once per empty shard before it.
            self._rotation = start + offset + 1
            self._backlog.extend(got)
            free -= len(got)
            if free <= 0:
                return
        if not self._backlog:
            got = await self.queue.read(
                ordered, self.consumer, count=1, block_ms=self.settings.block_ms
            )
            self._backlog.extend(got)

    def _spawn(self, entry: Entry) -> None:
        inflight = Inflight(entry.prediction_id)
        # Registered before the claim, so a cancel published after the claim commits is seen.
        self.receiver.inflight[entry.prediction_id] = inflight
        task = asyncio.create_task(self._handle(entry, inflight))
        self._tasks[entry.id] = task
        self.inflight[entry.id] = entry

        def done(finished: asyncio.Task[None]) -> None:
            if self._tasks.get(entry.id) is finished:
                del self._tasks[entry.id]
                self.inflight.pop(entry.id, None)
            self._slot_freed.set()

        task.add_done_callback(done)

    async def _handle(self, entry: Entry, inflight: Inflight) -> None:
        try:
            if await self._process(entry, inflight):
                await self.queue.ack(entry.stream, entry.id)
        except INFRASTRUCTURE_ERRORS as error:
            if not isinstance(error, RunnerError):
                self._backend_trouble = True
            log.warning("prediction %s left pending for retry: %r", entry.prediction_id, error)
        except Exception:
            log.exception("prediction %s: unexpected error; left pending", entry.prediction_id)
        finally:
            if self.receiver.inflight.get(entry.prediction_id) is inflight:
                del self.receiver.inflight[entry.prediction_id]

    async def _process(self, entry: Entry, inflight: Inflight) -> bool:
        """Returns True when the entry may be acknowledged (its prediction is terminal)."""
        row = await store.claim(self.engine, entry.prediction_id, self.consumer)
        if row is None:
            await self._ensure_done(entry.prediction_id)
            return True
        inflight.attempt = row["attempt"]
        if row["attempt"] > 1:
            log.info(
                "claimed %s again (attempt %d, entry %s of %s, delivery %d)",
                entry.prediction_id,
                row["attempt"],
                entry.id,
                entry.stream,
                entry.deliveries,
            )
        if entry.deliveries > self.settings.max_deliveries:
            return await self._dead_letter(entry, row)
        tracker = AttemptTracker(
            self.engine,
            row,
            await self.outbound.publishing(row),
            self.settings.flush_interval,
            hardware=self.monitor.hardware,
        )
        if row["cancel_requested"] or inflight.cancel.is_set():
            return await self._settled(tracker, await tracker.finish(Status.CANCELED))
        if row["status"] == Status.PROCESSING.value:
            rerun = await self._interrupted(tracker, row)
            if rerun is None:
                return await self._settled(tracker, True)
            row = rerun
        deadline = row["deadline"]
        if deadline is not None and deadline <= datetime.now(UTC):
            return await self._settled(tracker, await tracker.finish(Status.ABORTED))
        cancel_in = (deadline - datetime.now(UTC)).total_seconds() if deadline else None
        execution = Execution(
            runner=self.runner,
            tracker=tracker,
            inflight=inflight,
            webhook=self.receiver.webhook_url(entry.prediction_id, row["attempt"]),
            timeout=self.deployment.prediction_timeout,
            cancel_in=cancel_in,
            cancel_grace=self.settings.cancel_grace,
            monitor=self.monitor,
            on_cancel_ignored=self._runner_ignored_cancel,
            # The request's own X-Priority wins over the deployment's.
            priority=row["priority"] or self.deployment.priority,
            backoff=self.backoff,
        )
        return await self._settled(tracker, await execution.run(row["input"]))

    async def _ensure_done(self, prediction_id: str) -> None:
        """A terminal prediction whose entry is still here: its director died after the commit
        and before the ack, maybe before publishing ``done``. Publish it, once."""
        events = self.outbound.events
        if await events.is_done(prediction_id):
            return
        row = await store.get(self.engine, prediction_id)
        if row is None or not Status(row["status"]).is_terminal:
            return
        final = orjson.dumps(render_prediction(row, self.outbound.policy.public_url)).decode()
        await events.finish(prediction_id, row["status"], row["error"], final=final)

    async def _interrupted(self, tracker: AttemptTracker, row: RowMapping) -> RowMapping | None:
        """A run lost with its director: start it over if the deployment allows another run,
        else fail it (terminal; returns None)."""
        if row["runs"] < self.deployment.max_attempts:
            rerun = await store.reset_for_rerun(self.engine, row["id"], row["attempt"])
            if rerun is not None:
                log.info("re-running %s (run %d)", row["id"], row["runs"] + 1)
                tracker.state.update(rerun)
                return rerun
        tracker.status = Status.PROCESSING
        await tracker.finish(Status.FAILED, error=INTERRUPTED)
        return None

    async def _dead_letter(self, entry: Entry, row: RowMapping) -> bool:
        reason = f"delivered {entry.deliveries} times without finishing"
        tracker = AttemptTracker(self.engine, row, await self.outbound.publishing(row))
        tracker.status = Status(row["status"])
        await tracker.finish(
            Status.FAILED,
            error=f"prediction could not be run: {reason} (moved to the dead-letter queue)",
        )
        await tracker.close()
        await self.reclaimer.dead_letter(entry, reason)
        metrics.DEAD_LETTERED.inc()
        log.warning("dead-lettered %s from %s: %s", entry.prediction_id, entry.stream, reason)
        return False  # already removed from the stream

    def _runner_ignored_cancel(self) -> None:
        log.warning("runner ignored a cancel: taking no work until its health check is READY")
        self.runner_suspect = True

    async def _settled(self, tracker: AttemptTracker, written: object) -> bool:
        await tracker.close()
        if written is not None:
            return True
        # Fenced out: ack only if someone else already made it terminal.
        row = await store.get(self.engine, tracker.prediction_id)
        return row is None or Status(row["status"]).is_terminal

    async def _listen_for_cancels(self) -> None:
        while not self.stopping.is_set():
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(CANCEL_CHANNEL)
                    async for message in pubsub.listen():
                        if message["type"] != "message":
                            continue
                        data = message["data"]
                        pid = data.decode() if isinstance(data, bytes) else str(data)
                        target = self.receiver.inflight.get(pid)
                        if target is not None:
                            target.cancel.set()
            except RedisError as error:
                log.debug("cancel subscription lost: %r", error)
                await self._pause(1.0)

    async def _drain(self) -> None:
        if not self._tasks:
            return
        log.info(
            "waiting up to %ss for %d in-flight predictions",
            self.settings.shutdown_grace,
            len(self._tasks),
        )
        _, pending = await asyncio.wait(
            list(self._tasks.values()), timeout=self.settings.shutdown_grace
        )
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
