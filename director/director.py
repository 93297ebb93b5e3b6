"""The director: read a queue entry, claim its prediction, drive the runner, record, ack.

One director runs beside one runner. It owns the read → claim → run → ack loop and nothing of
the public API. An entry is acknowledged only after its prediction's terminal state is
committed; any infrastructure failure (runner, Redis, Postgres unreachable) leaves the entry
pending, to be offered again by this director (each ``retry_interval``; while Postgres or Redis
is in trouble it reads nothing) or reclaimed by another one (``director.maintenance``). At start
and once its backends answer again it offers itself every entry pending for it that it is not
running. A delivery for a prediction another live director is running changes nothing: it is
acknowledged and dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import orjson
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError, ResponseError
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
from director.reclaim import Reclaimer, Retries
from director.runner_client import STOCK_COG, RunnerClient, RunnerError, SnapshotFeed
from director.runner_monitor import RunnerMonitor
from director.settings import DirectorSettings
from runners.protocol import HealthStatus
from tracker import store
from tracker.events import EventLog, EventType
from tracker.render import render_prediction
from tracker.states import Status
from tracker.tracker import AttemptTracker, Publishing

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
        self.inflight: dict[tuple[str, str], Entry] = {}  # entry key -> entry being handled
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._backlog: collections.deque[Entry] = collections.deque()
        self._slot_freed = asyncio.Event()
        self._rotation = 0
        self._backend_trouble = False
        #: Entries that failed here (or wait for a twin running here), to be offered again.
        self.retries = Retries()
        #: Offer every entry pending for this consumer again: at start, after backend trouble.
        self._sweep_due = True
        self._trackers: dict[tuple[str, str], AttemptTracker] = {}  # entry key -> its tracker
        #: Loop time of the last heartbeat that found this director's entries still its own.
        self.lease_renewed = float("-inf")
        #: Heartbeat now (set by ``director.maintenance``): before publishing after a stall.
        self.renew_lease: Callable[[], Awaitable[None]] | None = None
        self.runner_suspect = False  # ignored a cancel: take no work until it is READY again

    @property
    def all_streams(self) -> list[str]:
        return self.streams + self.draining

    def has_capacity(self) -> int:
        return self.settings.concurrency - len(self._tasks) - len(self._backlog)

    def _handling(self, entry: Entry) -> bool:
        """Already running or waiting here, under this entry or another for the prediction."""
        return (
            entry.key in self._tasks
            or entry.prediction_id in self.receiver.inflight
            or any(
                e.key == entry.key or e.prediction_id == entry.prediction_id for e in self._backlog
            )
        )

    def add_entries(self, entries: list[Entry]) -> None:
        for entry in entries:
            if self._handling(entry):
                self._defer(entry)
            else:
                self._backlog.append(entry)
        self._slot_freed.set()

    def _defer(self, entry: Entry) -> None:
        """Another entry for a prediction running here waits until that run is over."""
        if entry.key not in self._tasks and not self._in_backlog(entry.key):
            later = asyncio.get_running_loop().time() + self.settings.retry_interval
            self.retries.add(entry.stream, entry.id, later, entry.prediction_id)

    def _in_backlog(self, key: tuple[str, str]) -> bool:
        return any(e.key == key for e in self._backlog)

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
        failures = 0
        while not self.stopping.is_set():
            free = self.settings.concurrency - len(self._tasks)
            if free <= 0 or self.runner_suspect:
                await self._wait_for_slot()
                continue
            try:
                await self._fill_backlog(free)
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
                await self.queue.ensure_groups(self.all_streams)
            except INFRASTRUCTURE_ERRORS as error:
                failures += 1
                await self._back_off(failures, error)
                continue
            while self._backlog and len(self._tasks) < self.settings.concurrency:
                entry = self._backlog.popleft()
                if self._handling(entry):  # a redelivery of what runs here waits its turn
                    self._defer(entry)
                else:
                    self._spawn(entry)

    async def _fill_backlog(self, free: int) -> None:
        if self._backend_trouble:
            # Entries read now would fail and pile up here: read nothing until both answer.
            await self._check_backends()
            log.info("Postgres and Redis answer again: offering pending entries again")
            self._backend_trouble = False
            self._sweep_due = True
        if not self.monitor.gone:  # a runner that is away: leave failed entries to others
            if self._sweep_due:
                await self._sweep()
                self._sweep_due = False
            await self._offer_retries(free - len(self._backlog))
        if not self._backlog:
            await self._read_new(free)

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

    async def _check_backends(self) -> None:
        """Raises the infrastructure error while Redis or Postgres does not answer."""
        await self.redis.ping()
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def _sweep(self) -> None:
        """Put every entry pending for this consumer that is not running or waiting here on
        the retry set, due now: at start nothing runs, after an outage some may."""
        for stream in self.all_streams:
            for entry_id in await self.queue.delivery_counts(stream, self.consumer):
                known = (stream, entry_id) in self.retries  # failed here: keeps its time
                key = (stream, entry_id)
                if not known and key not in self._tasks and not self._in_backlog(key):
                    self.retries.add(stream, entry_id, 0.0)

    async def _offer_retries(self, room: int) -> None:
        """Re-deliver (counting a delivery) due entries of the retry set, up to ``room``."""
        if room <= 0 or not self.retries:
            return
        now = asyncio.get_running_loop().time()
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id, prediction_id in self.retries.due(now):
            if (stream, entry_id) in self._tasks or self._in_backlog((stream, entry_id)):
                self.retries.discard(stream, entry_id)  # running or about to: never re-deliver
            elif prediction_id in self.receiver.inflight:
                later = now + self.settings.retry_interval
                self.retries.add(stream, entry_id, later, prediction_id)
            elif room > 0:
                by_stream.setdefault(stream, []).append(entry_id)
                room -= 1
        for stream, ids in by_stream.items():
            entries = await self.reclaimer.reoffer(stream, ids)
            for entry_id in ids:
                self.retries.discard(stream, entry_id)
            self.add_entries(entries)

    async def _read_new(self, free: int) -> None:
        """Shards in turn, round robin, in one round trip; then one blocking read of all."""
        streams = self.all_streams
        start = self._rotation % len(streams)
        ordered = streams[start:] + streams[:start]
        got, passed = await self.queue.read_in_turn(ordered, self.consumer, free)
        if got:
            # Round robin over the shards that have work: the next read starts after the last
            # one that gave some, so a flooded shard is served once per turn.
            self._rotation = start + passed
            self._backlog.extend(got)
            return
        got = await self.queue.read(
            ordered, self.consumer, count=1, block_ms=self.settings.block_ms
        )
        self._backlog.extend(got)

    def _spawn(self, entry: Entry) -> None:
        inflight = Inflight(entry.prediction_id)
        # Registered before the claim, so a cancel published after the claim commits is seen.
        self.receiver.inflight[entry.prediction_id] = inflight
        task = asyncio.create_task(self._handle(entry, inflight))
        self._tasks[entry.key] = task
        self.inflight[entry.key] = entry

        def done(finished: asyncio.Task[None]) -> None:
            if self._tasks.get(entry.key) is finished:
                del self._tasks[entry.key]
                self.inflight.pop(entry.key, None)
            self._slot_freed.set()

        task.add_done_callback(done)

    async def _handle(self, entry: Entry, inflight: Inflight) -> None:
        acked = False
        try:
            if await self._process(entry, inflight):
                await self.queue.ack(entry.stream, entry.id)
                acked = True
        except INFRASTRUCTURE_ERRORS as error:
            if not isinstance(error, RunnerError):
                self._backend_trouble = True
            log.warning("prediction %s left pending for retry: %r", entry.prediction_id, error)
        except Exception:
            log.exception("prediction %s: unexpected error; left pending", entry.prediction_id)
        finally:
            self._trackers.pop(entry.key, None)
            if self.receiver.inflight.get(entry.prediction_id) is inflight:
                del self.receiver.inflight[entry.prediction_id]
        if not acked:  # offered again later, if it is still pending for this director then
            later = asyncio.get_running_loop().time() + self.settings.retry_interval
            self.retries.add(entry.stream, entry.id, later, entry.prediction_id)

    async def _claim(self, entry: Entry) -> RowMapping | bool:
        """Claim the entry's prediction: its row, or whether to ack the entry without a run.

        Taken when unclaimed, claimed by this director's name before, or claimed by a director
        that is no longer alive; one running on a live director is left alone, and this
        duplicate entry dropped (that director's own entry and the reconciler cover the rest).
        """
        prediction_id = entry.prediction_id
        row = await store.claim(self.engine, prediction_id, self.consumer)
        if row is not None:
            return row
        current = await store.get(self.engine, prediction_id)
        if current is None or Status(current["status"]).is_terminal:
            await self._ensure_done(current)
            return True
        owner: str | None = current["claim_owner"]
        if owner is not None and await self.queue.is_alive(owner):
            log.info(
                "%s is running on live director %s: dropping duplicate entry %s of %s",
                prediction_id,
                owner,
                entry.id,
                entry.stream,
            )
            return True
        takeable = (owner,) if owner is not None else ()
        row = await store.claim(self.engine, prediction_id, self.consumer, takeable)
        return row if row is not None else False  # changed hands meanwhile: look again later

    async def _process(self, entry: Entry, inflight: Inflight) -> bool:
        """Returns True when the entry may be acknowledged (its prediction is terminal)."""
        claimed = await self._claim(entry)
        if isinstance(claimed, bool):
            return claimed
        row = claimed
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
            await self._publishing(entry, row),
            self.settings.flush_interval,
            hardware=self.monitor.hardware,
        )
        self._trackers[entry.key] = tracker
        if row["cancel_requested"] or inflight.cancel.is_set():
            return await self._settled(tracker, await tracker.finish(Status.CANCELED))
        if row["status"] == Status.PROCESSING.value:
            feed = await self._attach(entry, row)
            if feed is not None:
                tracker.status = Status.PROCESSING
                return await self._execute(entry, inflight, tracker, row, feed)
            rerun = await self._rerun(row)
            if rerun is None:
                tracker.status = Status.PROCESSING
                failed = await tracker.finish(Status.FAILED, error=INTERRUPTED)
                return await self._settled(tracker, failed)
            tracker.state.update(rerun)
            row = rerun
        return await self._execute(entry, inflight, tracker, row)

    async def _execute(
        self,
        entry: Entry,
        inflight: Inflight,
        tracker: AttemptTracker,
        row: RowMapping,
        feed: SnapshotFeed | None = None,
    ) -> bool:
        """Run the prediction, or with ``feed`` follow the run already under way."""
        deadline = row["deadline"]
        if feed is None and deadline is not None and deadline <= datetime.now(UTC):
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
        if feed is not None:  # a deadline already past cancels it on the runner at once
            return await self._settled(tracker, await execution.resume(feed))
        return await self._settled(tracker, await execution.run(row["input"]))

    async def _publishing(self, entry: Entry, row: RowMapping) -> Publishing:
        publishing = await self.outbound.publishing(row)
        publishing.events = _AttemptEvents(publishing.events, lambda: self._still_ours(entry))
        if publishing.webhooks is not None:
            publishing.webhooks.still_ours = lambda: self._still_ours(entry)
        return publishing

    async def _still_ours(self, entry: Entry) -> bool:
        """Whether this attempt may still publish. After a stall (no heartbeat for half the
        visibility timeout) another director may have taken over: heartbeat first."""
        inflight = self.receiver.inflight.get(entry.prediction_id)
        if inflight is None or inflight.lost:
            return False
        now = asyncio.get_running_loop().time()
        if self.renew_lease is not None and now - self.lease_renewed > self._lease_span:
            await self.renew_lease()
        return not inflight.lost

    @property
    def _lease_span(self) -> float:
        return self.settings.visibility_timeout / 2

    def mark_lost(self, key: tuple[str, str], why: str) -> None:
        """This attempt no longer owns its prediction: stop it, and let it publish nothing."""
        entry = self.inflight.get(key)
        inflight = self.receiver.inflight.get(entry.prediction_id) if entry else None
        if entry is None or inflight is None or inflight.lost:
            return
        inflight.lost = True
        tracker = self._trackers.get(key)
        if tracker is not None:
            tracker.fenced = True
            if tracker.publishing.webhooks is not None:
                tracker.publishing.webhooks.close()
        log.warning(
            "attempt %s of %s no longer owns it (%s): stopping",
            inflight.attempt,
            entry.prediction_id,
            why,
        )

    async def _ensure_done(self, row: RowMapping | None) -> None:
        """A terminal prediction whose entry is still here: its director died after the commit
        and before the ack, maybe before publishing ``done``. Publish it, once."""
        if row is None or not Status(row["status"]).is_terminal:
            return
        prediction_id = row["id"]
        events = self.outbound.events
        if await events.is_done(prediction_id):
            return
        final = orjson.dumps(render_prediction(row, self.outbound.policy.public_url)).decode()
        await events.finish(prediction_id, row["status"], row["error"], final=final)

    async def _attach(self, entry: Entry, row: RowMapping) -> SnapshotFeed | None:
        """The run a dead director left behind, when this director's runner is still running
        it: from now on its snapshots come here, and nothing runs twice. Only a Conduit runner
        can be asked; a stock Cog server would start a second run."""
        if self.monitor.capabilities.kind == STOCK_COG.kind:
            return None
        try:
            feed = await self.runner.attach(
                entry.prediction_id,
                row["input"],
                self.receiver.webhook_url(entry.prediction_id, row["attempt"]),
                tenant=str(row["account_id"]),
                priority=row["priority"] or self.deployment.priority,
            )
        except RunnerError as error:
            log.info("could not ask the runner about %s: %r", entry.prediction_id, error)
            return None
        if feed is not None:
            log.info(
                "%s is still running on the runner: following it (attempt %d)",
                entry.prediction_id,
                row["attempt"],
            )
        return feed

    async def _rerun(self, row: RowMapping) -> RowMapping | None:
        """A run lost with its director starts over if the deployment allows another run;
        None when it does not (the caller fails it as interrupted)."""
        if row["runs"] >= self.deployment.max_attempts:
            return None
        rerun = await store.reset_for_rerun(self.engine, row["id"], row["attempt"])
        if rerun is not None:
            log.info("re-running %s (run %d)", row["id"], row["runs"] + 1)
        return rerun

    async def _dead_letter(self, entry: Entry, row: RowMapping) -> bool:
        reason = f"delivered {entry.deliveries} times without finishing"
        tracker = AttemptTracker(self.engine, row, await self.outbound.publishing(row))
        tracker.status = Status(row["status"])
        failed = await tracker.finish(
            Status.FAILED,
            error=f"prediction could not be run: {reason} (moved to the dead-letter queue)",
        )
        if not await self._settled(tracker, failed):
            return False  # another attempt owns it now: its entry is not poison for it
        await self.reclaimer.dead_letter(entry, reason)
        metrics.DEAD_LETTERED.inc()
        log.warning("dead-lettered %s from %s: %s", entry.prediction_id, entry.stream, reason)
        return False  # already removed from the stream

    def _runner_ignored_cancel(self) -> None:
        log.warning("runner ignored a cancel: taking no work until its health check is READY")
        self.runner_suspect = True

    async def _settled(self, tracker: AttemptTracker, written: RowMapping | None) -> bool:
        """Whether the entry may be acknowledged: this attempt wrote a terminal state, or it
        was fenced out and the prediction is terminal anyway."""
        await tracker.close()
        if written is not None:
            return True
        log.info(
            "attempt %d of %s no longer owns it: ended without writing a terminal state",
            tracker.attempt,
            tracker.prediction_id,
        )
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


class _AttemptEvents(EventLog):
    """The event log as one attempt sees it: once the attempt has lost its prediction to
    another director it appends nothing more but its own terminal events (which only follow a
    terminal write that won in Postgres)."""

    def __init__(self, events: EventLog, still_ours: Callable[[], Awaitable[bool]]) -> None:
        super().__init__(events.redis, events.retention)
        self._still_ours = still_ours

    async def append(
        self,
        prediction_id: str,
        events: Sequence[tuple[EventType, str]],
        final: str | None = None,
    ) -> None:
        terminal = any(kind is EventType.DONE for kind, _ in events)
        if events and not terminal and not await self._still_ours():
            return
        await super().append(prediction_id, events, final)
