"""The director: read a queue entry, claim its prediction, drive the runner, record, ack.

One director runs beside one runner, or serves several deployments on the slots of one model
pool host (``director.lanes``: a lane per deployment, one concurrency budget). It owns the
read → claim → run → ack loop and nothing of the public API. An entry is acknowledged only
after its prediction's terminal state is committed; any infrastructure failure (runner, Redis,
Postgres unreachable) leaves the entry pending, to be offered again by this director (each
``retry_interval``; while Postgres or Redis is in trouble it reads nothing) or reclaimed by
another one (``director.leases``). At start and once its backends answer again it offers itself
every entry pending for it that it is not running. A delivery for a prediction another live
director is running changes nothing: it is acknowledged and dropped.

Its parts: ``Attempts`` (one record per entry held), ``Intake`` (where entries come from),
``AttemptHandler`` (claim → run → record one entry; one per lane), ``Heartbeats`` and
``Takeover`` (leases), ``Reconciler`` (predictions missing from every stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError
from sqlalchemy import text

from conduit.logging_setup import bound
from director.attempts import Attempt, Attempts
from director.claims import Claims
from director.deployment import ServedDeployment
from director.handling import AttemptHandler
from director.intake import Intake
from director.lanes import Lane, Lanes
from director.leases import Heartbeats, Takeover
from director.outbound import Outbound
from director.pool_slots import PoolSlots
from director.queue import Queue
from director.read_order import REFRESH_INTERVAL, ReadOrder
from director.reclaim import Reclaimer
from director.reconciler import Reconciler
from director.runner_client import RunnerClient, RunnerError
from director.runner_monitor import RunnerMonitor
from director.settings import DirectorSettings
from runners.protocol import HealthStatus
from tracker import keys
from tracker.batch_writes import StateWrites
from tracker.retry import TRANSIENT, backoff_delay

log = logging.getLogger(__name__)

#: A deployment served, the runner it runs on, and that runner's pool slot model (if any).
Serving = tuple[ServedDeployment, RunnerClient, str | None]

#: What leaves an entry pending for a retry rather than failing its prediction.
INFRASTRUCTURE_ERRORS = (RunnerError, *TRANSIENT)


class Director:
    def __init__(
        self,
        settings: DirectorSettings,
        served: Sequence[Serving],
        writes: StateWrites,
        redis: Redis,
        attempts: Attempts,
        consumer: str,
        outbound: Outbound,
        webhook_url: Callable[[Attempt], str],
    ) -> None:
        """``served``: each deployment with its runner (and pool slot model), in the order
        given. ``writes``: the process's grouped state writes. ``webhook_url(attempt)``: where
        the runner sends that claimed attempt's snapshots (the receiver, which shares
        ``attempts``; the URL holds the attempt's secret)."""
        self.settings = settings
        engine = self.engine = writes.engine
        self.redis = redis
        self.consumer = consumer
        self.attempts = attempts
        self.queue = Queue(redis)
        reclaimer = Reclaimer(self.queue, consumer)
        self.heartbeats = Heartbeats(
            redis,
            reclaimer,
            engine,
            attempts,
            interval=settings.heartbeat_every,
            visibility_timeout=settings.visibility_timeout,
        )
        claims = Claims(writes, self.queue, consumer, outbound.events, outbound.policy.public_url)
        parts = (writes, outbound, claims, reclaimer, webhook_url)
        self.lanes = Lanes([self._lane(d, runner, model, *parts) for d, runner, model in served])
        deployments = [lane.deployment for lane in self.lanes]
        draining = [
            stream
            for d in deployments
            for stream in d.draining(settings.drain_shards, settings.drain_streams.split(","))
        ]
        self.intake = Intake(
            self.queue,
            reclaimer,
            attempts,
            self.heartbeats,
            [d.streams() for d in deployments],
            list(dict.fromkeys(draining)),
            retry_interval=settings.retry_interval,
            block_ms=settings.block_ms,
        )
        #: With several deployments: the order their streams are read in.
        self.read_order: ReadOrder | None = None
        if len(self.lanes) > 1:
            first = self.lanes[0].runner
            slots = None
            if settings.pool_url is not None:
                slots = PoolSlots(settings.pool_url, first.session, first.auth)
            self.read_order = ReadOrder(
                self.queue,
                self.intake.groups,
                [d.name for d in deployments],
                [lane.model for lane in self.lanes],
                slots,
                settings.aging_bound,
            )
            self.intake.order = self.read_order.order
        idle_ms = int(settings.visibility_timeout * 1000)
        self.takeover = Takeover(
            reclaimer, self.intake, attempts.free, idle_ms, legacy=self._legacy_backlog
        )
        targets = [target for d in deployments for target in d.targets]
        self.reconciler = Reconciler(
            settings, engine, self.queue, targets, lambda: self.intake.streams, consumer
        )
        self.stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._backend_trouble = False
        #: The monitor of a runner that ignored a cancel: no work is taken until it is READY.
        self.suspect: RunnerMonitor | None = None
        #: ``loop.time()`` of the read loop's latest turn; None before the first. The loop
        #: turns at least every ``block_ms`` (or back-off pause) while it runs (``/livez``).
        self.last_turn: float | None = None

    def _lane(
        self,
        deployment: ServedDeployment,
        runner: RunnerClient,
        model: str | None,
        writes: StateWrites,
        outbound: Outbound,
        claims: Claims,
        reclaimer: Reclaimer,
        webhook_url: Callable[[Attempt], str],
    ) -> Lane:
        settings = self.settings
        monitor = RunnerMonitor(
            runner, settings.runner_check_interval, settings.runner_check_failures
        )
        handler = AttemptHandler(
            settings=settings,
            deployment=deployment,
            writes=writes,
            runner=runner,
            monitor=monitor,
            outbound=outbound,
            claims=claims,
            reclaimer=reclaimer,
            webhook_url=webhook_url,
            on_cancel_ignored=lambda: self._runner_ignored_cancel(monitor),
        )
        return Lane(deployment, runner, monitor, handler, model)

    @property
    def deployment(self) -> ServedDeployment:
        """The first deployment served (the only one, unless several share a pool host)."""
        return self.lanes[0].deployment

    @property
    def monitor(self) -> RunnerMonitor:
        """The first deployment's runner monitor."""
        return self.lanes[0].monitor

    @property
    def runner_suspect(self) -> bool:
        return self.suspect is not None

    async def _legacy_backlog(self) -> list[str]:
        settings = self.settings
        found: list[str] = []
        for lane in self.lanes:
            found += await lane.deployment.legacy_backlog(self.queue, settings.drain_shards)
        return found

    async def run(self) -> None:
        """Serve until ``stopping`` is set, then let in-flight predictions finish."""
        await self.queue.ensure_groups(self.intake.streams)
        if self.read_order is not None:
            await self.read_order.refresh()
        for lane in self.lanes:  # learn each runner's hardware before the first prediction
            await lane.monitor.check()
        settings = self.settings
        helpers = [
            asyncio.create_task(self._listen_for_cancels()),
            *self._read_order_refresh(),
            *(asyncio.create_task(lane.monitor.run_forever()) for lane in self.lanes),
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

    async def _read_loop(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            self.last_turn = loop.time()
            free = self.attempts.idle_workers()
            if free <= 0 or self.runner_suspect:
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
                if "NOGROUP" not in str(error):
                    raise
                log.warning("consumer group missing (Redis lost its data?): recreating")
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
        await self.intake.fill(free, offer_own=not all(lane.monitor.gone for lane in self.lanes))

    def _spawn(self, attempt: Attempt) -> None:
        # The task's log lines name the prediction (conduit.logging_setup); the handler adds
        # the request id once the claim has read it.
        with bound(prediction_id=attempt.entry.prediction_id):
            attempt.task = asyncio.create_task(self._handle(attempt))
        attempt.task.add_done_callback(lambda _: self._slot_freed.set())

    async def _handle(self, attempt: Attempt) -> None:
        entry = attempt.entry
        acked = False
        try:
            if await self.lanes.of(entry.stream).handler.process(attempt):
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
        suspect = self.suspect
        timeout = 1.0 if suspect is not None else self.settings.block_ms / 1000
        stop = asyncio.ensure_future(self.stopping.wait())
        slot = asyncio.ensure_future(self._slot_freed.wait())
        await asyncio.wait({stop, slot}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        slot.cancel()
        if suspect is not None and suspect.status is HealthStatus.READY:
            log.info("runner is READY again; taking work")
            self.suspect = None

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

    def _runner_ignored_cancel(self, monitor: RunnerMonitor) -> None:
        log.warning("runner ignored a cancel: taking no work until its health check is READY")
        self.suspect = monitor

    async def _listen_for_cancels(self) -> None:
        while not self.stopping.is_set():
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(keys.CANCEL_CHANNEL)
                    async for message in pubsub.listen():
                        if message["type"] != "message":
                            continue
                        data = message["data"]
                        pid = data.decode() if isinstance(data, bytes) else str(data)
                        target = self.attempts.for_prediction(pid)
                        if target is not None:
                            target.cancel.set()
            except TRANSIENT as error:
                log.debug("cancel subscription lost: %r", error)
                await self._pause(1.0)
            except Exception:  # a cancel listener that stops is a director that ignores cancels
                log.exception("cancel subscription failed; subscribing again")
                await self._pause(1.0)

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
    """Run ``work`` forever, ``seconds`` apart; a backend outage skips a round, and so does
    any other failure (logged): heartbeats and takeovers must never stop for good."""
    name = getattr(work, "__name__", work)
    while True:
        try:
            await work()
        except TRANSIENT as error:
            log.debug("%s skipped: %r", name, error)
        except Exception:
            log.exception("%s failed; trying again in %gs", name, seconds)
        await asyncio.sleep(seconds)
