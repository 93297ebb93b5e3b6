"""What happens to one queue entry once a worker takes it: claim, run, record.

``AttemptHandler.process`` returns whether the entry may be acknowledged: its prediction is
terminal (written by this attempt, or by another one that fenced this one out), or there was
nothing to run. Infrastructure errors propagate: the entry stays pending. A data error is no
such thing: the tracker records it as the prediction's failure, and a failure Postgres refuses
too (:class:`UnrecordableResult`) dead-letters the entry rather than offering it forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy.engine import RowMapping

from core.backoff import StartBackoff
from core.logs import REQUEST_ID
from director.attempts import Attempt
from director.claims import Claimed, Claims, Unclaimed, attach
from director.deployment import ServedDeployment
from director.execution import Execution
from director.jobs import PREDICTIONS, JobKind
from director.metrics import DirectorMetrics
from director.outbound import Outbound
from director.outcomes import Outcome, record
from director.output_files import OutputStore
from director.reclaim import Reclaimer
from director.runner_monitor import RunnerMonitor
from director.settings import DirectorSettings
from protocol.client import RunnerClient
from protocol.feed import SnapshotFeed
from tracker.ledger import Ledger
from tracker.publishing import Publishing
from tracker.run_output import Caps
from tracker.states import Lifecycle, Status
from tracker.tracker import AttemptTracker, UnrecordableResult

log = logging.getLogger(__name__)

INTERRUPTED = (
    "prediction interrupted: its run was lost before it finished (the director or the runner "
    "running it stopped); it is safe to retry"
)


class AttemptHandler:
    def __init__(
        self,
        *,
        settings: DirectorSettings,
        deployment: ServedDeployment,
        ledger: Ledger,
        runner: RunnerClient,
        monitor: RunnerMonitor,
        outbound: Outbound,
        claims: Claims,
        reclaimer: Reclaimer,
        webhook_url: Callable[[Attempt], str],
        on_cancel_ignored: Callable[[], None],
        metrics: DirectorMetrics,
        output: OutputStore | None = None,
        job: JobKind = PREDICTIONS,
    ) -> None:
        self.settings = settings
        self.deployment = deployment
        self.ledger = ledger
        self.runner = runner
        self.monitor = monitor
        self.outbound = outbound
        self.claims = claims
        self.reclaimer = reclaimer
        self.webhook_url = webhook_url
        self.on_cancel_ignored = on_cancel_ignored
        self.metrics = metrics
        #: Where output files go; None: the runner sends them inline, as data URLs.
        self.output = output
        #: What this director runs: predictions, or a trainer's trainings.
        self.job = job
        self.caps = Caps(settings.max_output_bytes, settings.max_log_bytes)
        self.backoff = StartBackoff(
            initial=settings.start_backoff_initial,
            max_delay=settings.start_backoff_max,
            max_retry_after=settings.retry_after_max,
            jitter=settings.retry_after_jitter,
        )

    async def process(self, attempt: Attempt) -> bool:
        try:
            return await self._process(attempt)
        except UnrecordableResult as error:
            reason = f"its end could not be recorded ({error})"
            await self.reclaimer.dead_letter(attempt.entry, reason)
            self.metrics.dead_lettered.inc()
            log.error("dead-lettered %s: %s", attempt.prediction_id, reason)
            return False  # already removed from the stream

    async def _process(self, attempt: Attempt) -> bool:
        entry = attempt.entry
        claim = await self.claims.claim(entry, self.deployment.version_id)
        if not isinstance(claim, Claimed):
            return claim is Unclaimed.DROP
        row = claim.row
        if request_id := row.get("request_id"):  # this task's later lines carry the create's
            REQUEST_ID.set(request_id)
        attempt.lease.attempt = row["attempt"]
        attempt.account_id = row["account_id"]
        if row["attempt"] > 1:
            log.info(
                "claimed %s again (attempt %d, entry %s of %s, delivery %d)",
                entry.prediction_id,
                row["attempt"],
                entry.id,
                entry.stream,
                entry.deliveries,
            )
        publishing = await self.outbound.publishing(row, attempt.lease)
        if entry.deliveries > self.settings.max_deliveries:
            return await self._dead_letter(attempt, row, publishing)
        if row["cancel_requested"] or attempt.cancel.is_set():
            return await self._end(self._tracker(row, publishing), Outcome(Status.CANCELED))
        if row["status"] == Status.PROCESSING.value:
            return await self._left_running(attempt, row, publishing)
        tracker = self._tracker(row, publishing)
        if row["attempt"] > 1:
            # An earlier attempt may have started it and died before writing its start
            # (``start_write_delay``): if the runner still runs it, follow it.
            feed = await self._attach(attempt, row)
            if feed is not None:
                return await self._execute(attempt, tracker, row, feed)
        return await self._execute(attempt, tracker, row)

    async def _left_running(
        self, attempt: Attempt, row: RowMapping, publishing: Publishing
    ) -> bool:
        """Left running by a dead director: follow it, run it again, or fail it as interrupted.
        The attach hands the runner this attempt's URL: what the dead director's URL fed
        before now feeds nothing."""
        feed = await self._attach(attempt, row)
        if feed is not None:
            tracker = self._tracker(row, publishing, Lifecycle.resumed())
            return await self._execute(attempt, tracker, row, feed)
        rerun = await self.claims.rerun(row, self.job.runs(self.deployment.max_attempts))
        if rerun is None:
            interrupted = Outcome(Status.FAILED, error=INTERRUPTED)
            return await self._end(self._tracker(row, publishing), interrupted)
        if not isinstance(rerun, Claimed):
            return rerun is Unclaimed.DROP
        tracker = self._tracker(rerun.row, publishing, Lifecycle.rerun())
        return await self._execute(attempt, tracker, rerun.row)

    async def _attach(self, attempt: Attempt, row: RowMapping) -> SnapshotFeed | None:
        """The run an earlier attempt left on this director's runner, handed this attempt's
        URL; None when the runner does not run it (or cannot be asked)."""
        webhook = self.webhook_url(attempt)
        return await attach(
            self.runner, self.monitor, row, webhook, self._priority(row), self._files_url(webhook)
        )

    def _tracker(
        self, row: RowMapping, publishing: Publishing, lifecycle: Lifecycle | None = None
    ) -> AttemptTracker:
        return self.ledger.tracker(
            row,
            publishing,
            self.settings.flush_interval,
            hardware=self.monitor.hardware,
            lifecycle=lifecycle,
            caps=self.caps,
        )

    def _files_url(self, webhook: str) -> str | None:
        """Where the runner PUTs this attempt's output files (the receiver's files route)."""
        return f"{webhook}/files/" if self.output is not None else None

    def _priority(self, row: RowMapping) -> str:
        # The request's own X-Priority wins over the deployment's.
        return str(row["priority"] or self.deployment.priority)

    async def _execute(
        self,
        attempt: Attempt,
        tracker: AttemptTracker,
        row: RowMapping,
        feed: SnapshotFeed | None = None,
    ) -> bool:
        """Run the prediction, or with ``feed`` follow the run already under way."""
        deadline = row["deadline"]
        if feed is None and deadline is not None and deadline <= datetime.now(UTC):
            return await self._end(tracker, Outcome(Status.ABORTED))
        cancel_in = (deadline - datetime.now(UTC)).total_seconds() if deadline else None
        webhook = self.webhook_url(attempt)
        keeper = None
        if self.output is not None:
            keeper = self.output.keeper(row["account_id"], attempt.prediction_id)
        execution = Execution(
            runner=self.runner,
            tracker=tracker,
            attempt=attempt,
            webhook=webhook,
            timeout=self.deployment.prediction_timeout,
            cancel_in=cancel_in,
            cancel_grace=self.settings.cancel_grace,
            monitor=self.monitor,
            on_cancel_ignored=self.on_cancel_ignored,
            priority=self._priority(row),
            backoff=self.backoff,
            metrics=self.metrics,
            output_file_prefix=self._files_url(webhook),
            keeper=keeper,
            on_success=self.job.on_success(row),
            runner_id=self.job.runner_id(row),
            start_write_delay=self.settings.start_write_delay,
        )
        if feed is not None:  # a deadline already past cancels it on the runner at once
            return await self._end(tracker, await execution.resume(feed))
        input = row["input"]
        if self.output is not None:
            input, gone = await self.output.runner_input(row["account_id"], input)
            if gone is not None:
                return await self._end(
                    tracker, Outcome(Status.FAILED, error=f"Invalid input: {gone}")
                )
        return await self._end(tracker, await execution.run(input))

    async def _dead_letter(self, attempt: Attempt, row: RowMapping, publishing: Publishing) -> bool:
        entry = attempt.entry
        reason = f"delivered {entry.deliveries} times without finishing"
        error = f"prediction could not be run: {reason} (moved to the dead-letter queue)"
        if not await self._end(self._tracker(row, publishing), Outcome(Status.FAILED, error=error)):
            return False  # another attempt owns it now: its entry is not poison for it
        await self.reclaimer.dead_letter(entry, reason)
        self.metrics.dead_lettered.inc()
        log.warning("dead-lettered %s from %s: %s", entry.prediction_id, entry.stream, reason)
        return False  # already removed from the stream

    async def _end(self, tracker: AttemptTracker, decided: Outcome | None) -> bool:
        """The one exit of an attempt: the terminal write of what it decided (nothing when it
        was fenced out before deciding), then its tracker closed. Whether the entry may be
        acknowledged: this attempt wrote a terminal state, or it was fenced out and the
        prediction is terminal anyway."""
        written = await record(tracker, decided) if decided is not None else None
        await tracker.close()
        if written is not None:
            log.info(
                "%s ended %s (attempt %d)",
                tracker.prediction_id,
                written["status"],
                tracker.attempt,
            )
            return True
        log.info(
            "attempt %d of %s no longer owns it: ended without writing a terminal state",
            tracker.attempt,
            tracker.prediction_id,
        )
        return await tracker.ended()
