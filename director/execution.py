"""Running one claimed prediction attempt on the runner, start to terminal state.

Starts the prediction, follows the runner's webhooks, forwards cancels, enforces the two
limits, and writes the terminal state through the tracker. The limits: the deployment's
prediction timeout (passing it *fails* the prediction, as Replicate's 30-minute timeout does)
and the client's ``Cancel-After`` deadline (passing it *cancels* the prediction, or *aborts*
one that never started). A runner that stops answering its health check while a prediction
runs is an infrastructure failure (``RunnerError``): the entry stays pending.
The run's state, and following it once started (snapshots, cancels, the limits), are
:class:`~director.following.Following`'s; :class:`Execution` adds the start.

A runner that refuses a start (busy, queue full, rate limited, still setting up) never fails
the prediction by itself: the start is offered again after its ``Retry-After`` (or a backoff)
for as long as the limits allow. If they pass first, the error says what the runner kept
answering. Accepted may mean queued inside the runner; the ``start`` webhook marks processing.
Each start tells the runner the time left until the first limit; a model pool host that cannot
load and run the model in it says so (``OutOfTime``), and the prediction ends then as it would
at the limit, with the pool's reason.

The times a runner reports are recorded (and billed) only as far as this director saw the run
take (:mod:`director.observed`). A model pool host reports on the accepted start how long it
held it (its model's cold start: ``load_time``; its queueing), added to the snapshots' times; a
run followed after a restart has no such start and records none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from core.unreachable import UNREACHABLE
from director.following import Following
from director.outcomes import Outcome
from director.output_files import SAVE_ERRORS, unkept_reason
from protocol.errors import (
    CannotServe,
    InputRejected,
    NoAnswer,
    OutOfTime,
    RunnerError,
    RunnerRefused,
)
from protocol.feed import SnapshotFeed
from tracker.states import Status

log = logging.getLogger(__name__)

RERUN_AFTER_OUTPUT = (
    "prediction interrupted: its run was lost after it had streamed output, and a new run "
    "could contradict what was streamed; it is safe to retry"
)


class Execution(Following):
    """One claimed attempt on the runner: started (or, after a restart, resumed), then followed."""

    async def run(self, input: dict[str, Any]) -> Outcome | None:
        """Run the prediction on the runner: how it ended, for the handler to write; None
        when this attempt was fenced out (another attempt or a cancel owns it now)."""
        rerun = self.tracker.attempt > 1 and self.on_success is None
        if rerun and await self.tracker.earlier_output():
            # Another attempt's run streamed output before it was lost: running the model
            # again would add a second, possibly different, output to the same stream.
            return Outcome(Status.FAILED, error=RERUN_AFTER_OUTPUT)
        try:
            started = await self._start(input)
        except InputRejected as rejected:
            return Outcome(Status.FAILED, error=f"Invalid input: {rejected.detail}")
        except OutOfTime as out:
            status = Status.ABORTED if self._by_deadline else Status.FAILED
            limit = "deadline" if self._by_deadline else f"timeout of {self.timeout:g}s"
            error = f"prediction cannot run within its {limit}: runner answered {out}"
            return Outcome(status, error=error)
        except CannotServe as never:
            error = f"the runner cannot run this model: it answered {never}"
            return Outcome(Status.FAILED, error=error)
        if not started:
            if self.attempt.cancel.is_set():
                return Outcome(Status.CANCELED)
            return self._at_limit()
        return await self._following()

    async def resume(self, feed: SnapshotFeed) -> Outcome | None:
        """Follow a run that an earlier attempt started and the runner is still running
        (``RunnerClient.attach``): its snapshots now come here, the state so far first."""
        self._accepted_at = self._loop.time()
        self._resumed = True
        # A run whose start was not written (``start_write_delay``) began after the create.
        state = self.tracker.state
        self._seen.resumed(state.get("started_at") or state.get("created_at"), self._accepted_at)
        self._feed_task = asyncio.create_task(self._read_feed(feed))
        return await self._following()

    async def _start(self, input: dict[str, Any]) -> bool:
        """Hand the prediction to the runner. False if canceled or out of time before it took it.

        Refusals are offered again after the runner's ``Retry-After`` (or a backoff); an
        unreachable runner too, until the limit (it may be restarting), unless the monitor
        counts it gone: then the failure is left to the queue's retry.
        """
        attempt = 0
        while True:
            await self._poll_cancel_flag(watching=True)
            if self.attempt.cancel.is_set() or self._loop.time() >= self._limit_at:
                return False
            retry_after: float | None = None
            self._seen.offered()
            try:
                accepted = await self.runner.start(
                    self.runner_id,
                    input,
                    self.webhook,
                    tenant=self.tenant,
                    priority=self.priority,
                    deadline=self._limit_at - self._loop.time(),
                    output_file_prefix=self.output_file_prefix,
                )
                self._accepted_at = self._loop.time()
                self._start_times = accepted.times
                if accepted.feed is not None:
                    self._feed_task = asyncio.create_task(self._read_feed(accepted.feed))
                return True
            except RunnerRefused as refusal:
                self.metrics.runner_refusals.labels(refusal.reason).inc()
                self._hold(refusal.reason, refusal.state, refusal)
                retry_after = refusal.retry_after
            except RunnerError as error:
                # Restarting runners come back within seconds; one that stays away is gone,
                # and the entry goes back to the queue's retry. So does a request that may have
                # reached the runner before it broke off: a runner that died running it and
                # came back would run it again under this one claim, where a redelivery counts
                # the run against the deployment's bounds (deliveries and runs).
                if self.monitor.gone or isinstance(error, NoAnswer):
                    raise
                self._hold("unreachable", "unreachable", error)
            wait = self.backoff.delay(attempt, retry_after)
            attempt += 1
            remaining = max(0.0, self._limit_at - self._loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.attempt.cancel.wait(), min(wait, remaining))
            if wait >= remaining:
                # No offer before the runner's wait is over: a timer that fires a hair early
                # must not sneak in one more start just short of the deadline.
                return False

    async def _read_feed(self, feed: SnapshotFeed) -> None:
        """Pass the runner's streamed snapshots on, as the receiver does its webhooks. If the
        stream breaks off, the runner sends the rest as webhooks instead."""
        try:
            async for snapshot in feed.snapshots():
                if self.keeper is not None:
                    snapshot.output = await self.keeper.keep(snapshot.output)
                self.attempt.snapshots.put_nowait(snapshot)
        except UNREACHABLE as error:
            log.info("snapshot stream of %s broke off: %r", self.prediction_id, error)
        except SAVE_ERRORS as error:
            self.attempt.cannot_keep(unkept_reason(error))
        finally:
            feed.close()

    def _hold(self, reason: str, state: str, error: RunnerError) -> None:
        if self._held_back is None or self._held_back[0] != reason:
            log.info("runner not taking %s yet (%s): %s", self.prediction_id, reason, error)
        self._held_back = (reason, state)
        if self._held_since is None:
            self._held_since = self._loop.time()
