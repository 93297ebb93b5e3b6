"""Following one attempt's run once the runner has it, to its terminal state (the start is
:mod:`director.execution`'s). :class:`Following` keeps the run's state and limits, applies the
runner's snapshots through the tracker, forwards cancels and looks for a flagged one, and
decides what passing a limit, or a runner that ignores a cancel, means for the prediction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from core.backoff import StartBackoff
from core.transient import TRANSIENT
from director.attempts import Attempt, Interruption
from director.metrics import DirectorMetrics
from director.observed import Observed
from director.outcomes import Outcome, OutputRefused, SuccessHook
from director.output_files import DataUrlKeeper
from director.runner_monitor import RunnerMonitor
from protocol.client import RunnerClient
from protocol.documents import PredictionResponse
from protocol.errors import RunnerError
from protocol.timings import RunnerTimes
from protocol.values import Priority, RunnerStatus
from tracker.batch_writes import ran
from tracker.states import Status
from tracker.tracker import AttemptTracker

log = logging.getLogger(__name__)

_TERMINAL = {
    RunnerStatus.SUCCEEDED: Status.SUCCEEDED,
    RunnerStatus.FAILED: Status.FAILED,
    RunnerStatus.CANCELED: Status.CANCELED,
}


class Following:
    """The state of one attempt's run, and following it once started; its start (or resume) is
    :class:`~director.execution.Execution`'s."""

    def __init__(
        self,
        *,
        runner: RunnerClient,
        tracker: AttemptTracker,
        attempt: Attempt,
        webhook: str,
        timeout: float,
        cancel_in: float | None = None,
        cancel_grace: float,
        monitor: RunnerMonitor,
        on_cancel_ignored: Callable[[], None] | None = None,
        priority: str = Priority.NORMAL,
        backoff: StartBackoff | None = None,
        metrics: DirectorMetrics,
        output_file_prefix: str | None = None,
        keeper: DataUrlKeeper | None = None,
        on_success: SuccessHook | None = None,
        runner_id: str | None = None,
        start_write_delay: float = 0.0,
    ) -> None:
        """``on_success``: what a succeeded run's output becomes before it is written; it
        raises :class:`OutputRefused` to fail the run instead, and its run may start again
        after output was streamed (nobody reads a training's output before its end).
        ``runner_id``: the id the runner knows the run by (default: the prediction's).
        ``start_write_delay``: seconds a run goes before its start is written (0: at once);
        one that ends sooner has its start written with its end, in one write."""
        self.runner = runner
        self.on_success = on_success
        self.tracker = tracker
        self.attempt = attempt
        self.webhook = webhook
        self.timeout = timeout
        self.cancel_grace = cancel_grace
        self.monitor = monitor
        self.generation = monitor.generation
        self.on_cancel_ignored = on_cancel_ignored
        self.priority = priority
        self.backoff = backoff or StartBackoff()
        self.metrics = metrics
        self.output_file_prefix = output_file_prefix
        self.keeper = keeper
        self.prediction_id = tracker.prediction_id
        self.runner_id = runner_id or self.prediction_id
        self.tenant = str(tracker.state["account_id"])
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        # Which limit comes first decides what passing it means.
        self._by_deadline = cancel_in is not None and cancel_in < timeout
        self._limit_at = now + (cancel_in if self._by_deadline and cancel_in else timeout)
        self._limit_hit = False
        #: Why the runner has not taken the prediction yet, and since when (loop time).
        self._held_back: tuple[str, str] | None = None  # (metric reason, how it reads)
        self._held_since: float | None = None
        #: When the runner accepted it (loop time); it may queue it before running it.
        self._accepted_at: float | None = None
        #: How long this director has seen the run take: the bound of the times it reports.
        self._seen = Observed(self.prediction_id, self._loop)
        #: What a model pool host held the accepted start for (``Accepted.times``).
        self._start_times = RunnerTimes()
        #: Reads the runner's snapshot stream, when it sends one (see ``RunnerClient.start``).
        self._feed_task: asyncio.Task[None] | None = None
        #: Next time (loop time) to look at the cancel flag in Postgres.
        self._flag_check_at = now + monitor.interval
        self.start_write_delay = start_write_delay
        #: Whether the runner said the model runs (its start may not be written yet), and
        #: since when (loop time).
        self._running = False
        self._running_since = now
        #: Whether this attempt took over a run an earlier attempt started (``resume``).
        self._resumed = False
        #: When (loop time) the start the runner reported is written, while it is not yet.
        self._start_due: float | None = None

    @property
    def timeout_error(self) -> str:
        return f"Prediction timed out after {self.timeout:g} seconds"

    def _not_started_error(self) -> str | None:
        """Why a prediction whose limit passed never started, as its error."""
        now = self._loop.time()
        if self._accepted_at is not None:
            why = f"it waited in the runner's queue for {now - self._accepted_at:.1f}s"
        elif self._held_back is not None and self._held_since is not None:
            why = f"runner stayed {self._held_back[1]} for {now - self._held_since:.1f}s"
        elif self._by_deadline:
            return None  # the deadline passed before this director got to it
        else:
            return f"{self.timeout_error} before it could start"
        limit = "deadline passed" if self._by_deadline else f"timed out after {self.timeout:g}s"
        return f"{why}; prediction {limit} before it could start"

    def _at_limit(self) -> Outcome:
        """The limit passed: canceled or failed if the model ran, aborted or failed if not."""
        if self._running or self.tracker.status is not Status.STARTING:
            if self._by_deadline:
                return Outcome(Status.CANCELED)
            return Outcome(Status.FAILED, error=self.timeout_error)
        if self._held_back is not None and self._accepted_at is None:
            self.metrics.not_started.labels(self._held_back[0]).inc()
        status = Status.ABORTED if self._by_deadline else Status.FAILED
        return Outcome(status, error=self._not_started_error())

    async def _following(self) -> Outcome | None:
        try:
            return await self._follow()
        except _Lost:
            log.warning("%s was reclaimed by another director; stopping here", self.prediction_id)
            return None
        finally:
            if self._feed_task is not None:
                self._feed_task.cancel()

    async def _follow(self) -> Outcome | None:
        grace_until: float | None = None
        while True:
            await self._poll_cancel_flag(watching=grace_until is None)
            limit = self._limit_at if grace_until is None else grace_until
            wait = await self._start_if_due(min(limit - self._loop.time(), self.monitor.interval))
            if wait is None:
                return None  # fenced out: another attempt or a cancel owns it now
            news = await self._next(wait, watch_cancel=grace_until is None)
            if isinstance(news, PredictionResponse):
                result = await self._apply(self._newest(news))
                if isinstance(result, bool):
                    return None  # fenced out: another attempt or a cancel owns it now
                if result is not None:
                    return result
            elif news == "unkept":  # the runner's output cannot be kept: fail it now
                await self._cancel_on_runner()
                return Outcome(Status.FAILED, error=self.attempt.unkept)
            elif news == "quiet" and self._loop.time() < limit:
                if self.monitor.generation != self.generation:
                    raise RunnerError(f"runner lost {self.prediction_id} (died or restarted)")
            elif grace_until is None:
                self._limit_hit = news != "cancel"
                await self._cancel_on_runner()
                grace_until = self._loop.time() + self.cancel_grace
            else:
                return self._cancel_ignored()

    async def _poll_cancel_flag(self, watching: bool) -> None:
        """Cancels are published fire-and-forget; one sent while this director was not
        subscribed is only in Postgres. Look there, at most once per monitor interval."""
        now = self._loop.time()
        if not watching or self.attempt.cancel.is_set() or now < self._flag_check_at:
            return
        self._flag_check_at = now + self.monitor.interval
        try:
            flagged = await self.tracker.cancel_flagged()
        except TRANSIENT as error:
            log.debug("cancel flag of %s not read: %r", self.prediction_id, error)
            return
        if flagged:
            log.info("%s was flagged for cancel; canceling on the runner", self.prediction_id)
            self.attempt.cancel.set()

    def _cancel_ignored(self) -> Outcome:
        """The runner never confirmed the cancel: record the outcome ourselves, and stop
        giving this runner work until it is healthy again."""
        if self.on_cancel_ignored is not None:
            self.on_cancel_ignored()
        if self._limit_hit:
            return self._at_limit()
        return Outcome(Status.CANCELED)

    async def _next(self, seconds: float, watch_cancel: bool) -> PredictionResponse | Interruption:
        if self.attempt.lease.lost:
            raise _Lost
        return await self.attempt.next_news(seconds, watch_cancel)

    def _newest(self, snapshot: PredictionResponse) -> PredictionResponse:
        """The snapshot that says the most of those already here: the terminal one, or else
        the last. Snapshots are cumulative, so the ones skipped add nothing to it; a fast
        run's start and end then make one write rather than two."""
        queue = self.attempt.snapshots
        while not snapshot.status.is_terminal and not queue.empty():
            snapshot = queue.get_nowait()
        return snapshot

    async def _apply(self, snapshot: PredictionResponse) -> Outcome | bool | None:
        """Apply one snapshot. Returns the run's outcome once it ended, True if fenced out,
        None to go on."""
        reported = RunnerTimes.from_metrics(snapshot.metrics).with_start(self._start_times)
        times = self._seen.bound(reported)
        if not await self._take_start(snapshot, times):
            return True
        if self.tracker.cancel_requested:
            self.attempt.cancel.set()  # flagged before it started: the follow loop cancels
        await self.tracker.progress(snapshot.output, snapshot.logs)
        if self.tracker.refused is not None and not snapshot.status.is_terminal:
            # Output or logs it cannot keep (past a cap, or unstorable): stop the run.
            await self._cancel_on_runner()
            return Outcome(Status.FAILED, error=self.tracker.refused, times=times)
        if not snapshot.status.is_terminal:
            return None
        status = _TERMINAL[snapshot.status]
        error = snapshot.error
        queued = self.tracker.status is Status.STARTING and not self._running
        if self._limit_hit and queued and not times.predict_time:
            # Canceled at the limit while still queued inside the runner: it never ran.
            status = Status.ABORTED if self._by_deadline else Status.FAILED
            error = self._not_started_error()
        elif self._limit_hit and not self._by_deadline:
            status, error = Status.FAILED, self.timeout_error
        output = snapshot.output
        if status is Status.SUCCEEDED and self.on_success is not None:
            try:
                output = await self.on_success(output)
            except OutputRefused as refused:
                status, error = Status.FAILED, str(refused)
        return Outcome(status, output=output, logs=snapshot.logs, error=error, times=times)

    async def _take_start(self, snapshot: PredictionResponse, times: RunnerTimes) -> bool:
        """Note the start a snapshot reports, and write it now or when it is due; False, the
        run canceled on the runner, when this attempt no longer owns the prediction."""
        starts = snapshot.status is RunnerStatus.PROCESSING or (
            snapshot.status.is_terminal
            and self.tracker.announces_start
            and ran(_TERMINAL[snapshot.status], times)
        )
        if not starts:
            return True
        if not self._running:
            self._running, self._running_since = True, self._loop.time()
        if self.tracker.status is Status.STARTING and self._defers_start(snapshot):
            if self._start_due is None:
                self._start_due = self._running_since + self.start_write_delay
                await self.tracker.running()  # the event now; the row when it is due
            return True
        return await self._write_start(deferred=False)

    async def _start_if_due(self, wait: float) -> float | None:
        """Write a deferred start that is due; how long the next wait may be (up to ``wait``,
        ending when the start falls due), or None when this attempt no longer owns the
        prediction."""
        if self._start_due is None:
            return wait
        now = self._loop.time()
        if now < self._start_due:
            return min(wait, self._start_due - now)
        if self.attempt.lease.lost:
            raise _Lost
        return wait if await self._write_start(deferred=True) else None

    def _defers_start(self, snapshot: PredictionResponse) -> bool:
        """Whether the start the runner reported waits for ``start_write_delay``: not when
        the prediction has intermediate webhooks (they carry its status), nor at its end."""
        return (
            self.start_write_delay > 0
            and not snapshot.status.is_terminal
            and self.tracker.start_may_wait
            and not self._resumed  # taken over running: it has run a while already
        )

    async def _write_start(self, deferred: bool) -> bool:
        """Write the start the runner reported; False when this attempt no longer owns the
        prediction, the run then canceled on the runner if the prediction ended (a cancel).
        A start written late may have been fenced out by an attempt that took the run over
        and now follows it on the same runner (``handling``): that run is not this one's to
        cancel."""
        self._start_due = None
        if await self.tracker.started(self._loop.time() - self._running_since):
            return True
        if not deferred or await self.tracker.ended():
            await self._cancel_on_runner()
        return False

    async def _cancel_on_runner(self) -> None:
        try:
            await self.runner.cancel(self.runner_id)
        except RunnerError as error:
            log.warning("cancel of %s not delivered to runner: %r", self.prediction_id, error)


class _Lost(Exception):
    """Another director reclaimed this entry (this one was presumed dead): stop quietly."""
