"""The director: read a queue entry, claim its prediction, drive the runner, record, ack.

One director runs beside one runner, or serves several deployments on the slots of one model
pool host (``director.drivers``: a driver per deployment, one concurrency budget). It owns the
read → claim → run → ack loop and nothing of the public API. An entry is acknowledged only
after its prediction's terminal state is committed; any infrastructure failure (runner, Redis,
Postgres unreachable) leaves the entry pending, to be offered again by this director (each
``retry_interval``; while Postgres or Redis is in trouble it reads nothing) or reclaimed by
another one (``director.leases``). At start and once its backends answer again it offers itself
every entry pending for it that it is not running. A delivery for a prediction another live
director is running changes nothing: it is acknowledged and dropped.

Its parts, built by the process (``director.assembly.build_director``): ``Attempts`` (one
record per entry held), ``Intake`` (where entries come from), ``AttemptHandler`` (claim → run →
record one entry; one per driver), ``Heartbeats`` and ``Takeover`` (leases), ``Reconciler``
(predictions missing from every stream), ``CancelListener`` and ``Suspicion`` (cancels).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from core.backoff import backoff_delay
from core.logs import bound
from core.periodic import Periodic
from core.transient import TRANSIENT
from director.attempts import Attempt, Attempts
from director.cancels import CancelListener, Suspicion
from director.deployment import ServedDeployment
from director.drivers import DeploymentDrivers
from director.intake import Intake
from director.leases import Heartbeats, Takeover
from director.queue import Queue, lost_stream
from director.read_order import REFRESH_INTERVAL, ReadOrder
from director.reconciler import Reconciler
from director.release_watch import ReleaseWatch
from director.runner_monitor import RunnerMonitor
from director.settings import DirectorSettings
from protocol.errors import RunnerError

log = logging.getLogger(__name__)

#: What leaves an entry pending for a retry rather than failing its prediction.
INFRASTRUCTURE_ERRORS = (RunnerError, *TRANSIENT)


class Director:
    def __init__(
        self,
        settings: DirectorSettings,
        *,
        redis: Redis,
        engine: AsyncEngine,
        consumer: str,
        attempts: Attempts,
        queue: Queue,
        drivers: DeploymentDrivers,
        intake: Intake,
        heartbeats: Heartbeats,
        takeover: Takeover,
        reconciler: Reconciler,
        read_order: ReadOrder | None,
        suspicion: Suspicion,
        release_watch: ReleaseWatch | None = None,
    ) -> None:
        """``read_order``: with several deployments, the order their streams are read in.
        ``suspicion``: the runner that ignored a cancel, shared with the drivers' handlers."""
        self.settings = settings
        self.redis = redis
        self.engine = engine
        self.consumer = consumer
        self.attempts = attempts
        self.queue = queue
        self.drivers = drivers
        self.intake = intake
        self.heartbeats = heartbeats
        self.takeover = takeover
        self.reconciler = reconciler
        self.read_order = read_order
        self.suspicion = suspicion
        self.release_watch = release_watch
        self.stopping = asyncio.Event()
        self.cancels = CancelListener(redis, attempts, self.stopping)
        self._slot_freed = asyncio.Event()
        self._backend_trouble = False
        #: ``loop.time()`` of the read loop's latest turn; None before the first. The loop
        #: turns at least every ``block_ms`` (or back-off pause) while it runs (``/livez``).
        self.last_turn: float | None = None

    @property
    def deployment(self) -> ServedDeployment:
        """The first deployment served (the only one, unless several share a pool host)."""
        return self.drivers[0].deployment

    @property
    def monitor(self) -> RunnerMonitor:
        """The first deployment's runner monitor."""
        return self.drivers[0].monitor

    async def run(self) -> None:
        """Serve until ``stopping`` is set, then let in-flight predictions finish."""
        await self.queue.ensure_groups(self.intake.streams)
        if self.read_order is not None:
            await self.read_order.refresh()
        for driver in self.drivers:  # learn each runner's hardware before the first prediction
            await driver.monitor.check()
        if self.release_watch is not None:  # read no queue whose deployment runs another version
            await self.release_watch.check()
        settings = self.settings
        helpers = [
            asyncio.create_task(self.cancels.run()),
            *self._read_order_refresh(),
            *self._release_checks(),
            *(asyncio.create_task(driver.monitor.run_forever()) for driver in self.drivers),
            asyncio.create_task(every(settings.heartbeat_every, self.heartbeats.renew)),
            asyncio.create_task(every(settings.claim_interval, self.takeover.claim)),
            asyncio.create_task(every(settings.reconcile_interval, self._reconcile)),
        ]
        try:
            await self._read_loop()
        finally:
            await self._drain()
            await self.queue.close()  # acks under way finish before the connections close
            for task in helpers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _read_order_refresh(self) -> list[asyncio.Task[None]]:
        """With several deployments, learn what is loaded and what waits before the first
        read, then about once a second."""
        if self.read_order is None:
            return []
        return [asyncio.create_task(every(REFRESH_INTERVAL, self.read_order.refresh))]

    def _release_checks(self) -> list[asyncio.Task[None]]:
        if self.release_watch is None:
            return []
        interval = self.settings.release_check_interval
        return [asyncio.create_task(every(interval, self.release_watch.check))]

    async def _read_loop(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            self.last_turn = loop.time()
            free = self.attempts.idle_workers()
            if free <= 0 or self.suspicion.monitor is not None:
                await self._wait_for_slot()
                continue
            try:
                await self._fill(free)
                failures = 0
            except NoScriptError as error:
                # Redis restarted without its data between a script's load and its call (the
                # client reloads it on the next call): as transient as the restart itself.
                failures += 1
                await self._back_off(failures, error)
                continue
            except ResponseError as error:
                if not lost_stream(error):
                    raise
                # Never fatal: the streams are made again and reading goes on.
                log.warning("a stream or its consumer group is gone (%s): recreating", error)
                await self.queue.ensure_groups(self.intake.streams)
            except INFRASTRUCTURE_ERRORS as error:
                failures += 1
                await self._back_off(failures, error)
                continue
            while (attempt := self.attempts.next_to_run()) is not None:
                self._spawn(attempt)

    async def _fill(self, free: int) -> None:
        if self._backend_trouble:
            # Entries read now would fail and pile up here: read nothing until both answer.
            await self._check_backends()
            log.info("Postgres and Redis answer again: offering pending entries again")
            self._backend_trouble = False
            self.intake.sweep_due = True
        # A runner that is away leaves this director's failed entries to others.
        await self.intake.fill(
            free, offer_own=not all(driver.monitor.gone for driver in self.drivers)
        )

    def _spawn(self, attempt: Attempt) -> None:
        # The task's log lines name the prediction (core.logs); the handler adds
        # the request id once the claim has read it.
        with bound(prediction_id=attempt.entry.prediction_id):
            attempt.task = asyncio.create_task(self._handle(attempt))
        attempt.task.add_done_callback(lambda _: self._slot_freed.set())

    async def _handle(self, attempt: Attempt) -> None:
        entry = attempt.entry
        acked = False
        try:
            if await self.drivers.of(entry.stream).handler.process(attempt):
                await self.queue.ack(entry.stream, entry.id)
                acked = True
        except INFRASTRUCTURE_ERRORS as error:
            if not isinstance(error, RunnerError):
                self._backend_trouble = True
            log.warning("prediction %s left pending for retry: %r", entry.prediction_id, error)
        except Exception:
            log.exception("prediction %s: unexpected error; left pending", entry.prediction_id)
        finally:
            self.attempts.remove(attempt)
        if not acked:  # offered again later, if it is still pending for this director then
            self.intake.retry_later(entry)

    async def _back_off(self, failures: int, error: BaseException) -> None:
        # Logged on the first failure and then rarely: no error storm.
        if failures == 1 or failures % 20 == 0:
            log.warning("queue unreachable (%d failures so far): %r", failures, error)
        await self._pause(backoff_delay(failures, initial=0.25, cap=5.0))

    async def _wait_for_slot(self) -> None:
        self._slot_freed.clear()
        # Bounded even when all workers are busy, so the loop keeps turning (``/livez``).
        suspect = self.suspicion.monitor
        timeout = 1.0 if suspect is not None else self.settings.block_ms / 1000
        stop = asyncio.ensure_future(self.stopping.wait())
        slot = asyncio.ensure_future(self._slot_freed.wait())
        await asyncio.wait({stop, slot}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        slot.cancel()
        self.suspicion.clear_if_ready(suspect)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _check_backends(self) -> None:
        """Raises the infrastructure error while Redis or Postgres does not answer."""
        await self.redis.ping()
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def _reconcile(self) -> None:
        await self.reconciler.pass_once()

    async def _drain(self) -> None:
        tasks = [a.task for a in self.attempts if a.task is not None]
        if not tasks:
            return
        grace = self.settings.shutdown_grace
        log.info("waiting up to %ss for %d in-flight predictions", grace, len(tasks))
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


async def every(seconds: float, work: Callable[[], Awaitable[None]]) -> None:
    """Run ``work`` forever, ``seconds`` apart, the first at once; a backend outage skips a
    round, and so does any other failure (logged): heartbeats and takeovers must never stop for
    good. A round that meets a stream or its group gone (a deleted deployment, a flushed
    Redis) skips quietly: the read loop makes them again."""
    name = getattr(work, "__name__", "work")

    async def round_() -> None:
        try:
            await work()
        except ResponseError as error:
            if not lost_stream(error):
                raise
            log.info("%s skipped a round: a stream or its group is gone (%s)", name, error)

    await Periodic(name, seconds, round_, name, log, TRANSIENT).run(at_once=True)
