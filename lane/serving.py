"""One ``/run`` through the lane: a permit (waiting in the bounded queue), the runner call, a
retry on another runner when the lane allows one, the answer, and the run's record.

A client that leaves while queued leaves the queue at once; one that leaves while its runner
works has the call cancelled and the run cancelled at the runner (in the background, owned by
the lane), and is recorded as canceled. The permit is given back exactly once per dispatch
(``LaneShell.done``), also when the handler itself is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from core.ids import new_prediction_id
from lane import runner_call
from lane.departure import Departure
from lane.errors import RunFailed, refusal
from lane.events import Dispatch, Fail, Outcome, Reject, band_of
from lane.outputs import OutputNotKept, RunOutputs, failed
from lane.request import Finished, Left, RunRequest, RunResult, Streamed, StreamEvent
from lane.runner_call import Answer
from lane.stream_events import SnapshotEvents
from protocol.capabilities import UNKNOWN_HARDWARE
from protocol.documents import PredictionResponse
from protocol.timings import RunnerTimes, decimal_seconds
from tracker.render import storable_text
from tracker.states import Status
from tracker.sync_runs import SyncRun

if TYPE_CHECKING:
    from lane.service import Lane

log = logging.getLogger(__name__)


class LaneRun:
    """One ``/run`` request on its way through the lane and to a runner."""

    def __init__(self, lane: Lane, request: RunRequest) -> None:
        self.lane = lane
        self.request = request
        self.id = new_prediction_id()
        self.began = time.perf_counter()
        self.created_at = datetime.now(UTC)
        self.started_at: datetime | None = None
        self.dispatched = 0.0
        self.hardware = UNKNOWN_HARDWARE
        self.departure = Departure(request.left)
        self.outputs = RunOutputs(request.output_files, request.account_id, self.id)

    def record(
        self, status: Status, prediction: PredictionResponse | None, error: str | None
    ) -> dict[str, Any]:
        """Record the run (in the background) and give its body."""
        observed = time.perf_counter() - self.dispatched if self.started_at else 0.0
        metrics = prediction.metrics if prediction is not None else {}
        times = RunnerTimes.from_metrics(metrics).within(observed)
        output = prediction.output if prediction is not None else None
        logs = prediction.logs if prediction is not None else ""
        completed = datetime.now(UTC)
        request, destination = self.request, self.request.placement
        run = SyncRun(
            id=self.id,
            account_id=request.account_id,
            model=destination.model,
            version_id=destination.version_id,
            deployment_id=destination.deployment_id,
            deployment=destination.deployment,
            target=destination.target,
            input=orjson.Fragment(request.input_json),
            status=status,
            output=output,
            logs=storable_text(logs) if logs else None,
            error=storable_text(error) if error is not None else None,
            times=times,
            hardware=self.hardware,
            created_at=self.created_at,
            started_at=self.started_at,
            completed_at=completed,
            priority=request.priority.value,
            request_id=request.request_id,
        )
        self.lane.recorder.record(run)
        total = (completed - self.created_at).total_seconds()
        return {
            "id": self.id,
            "status": status.value,
            "output": output,
            "error": error,
            "metrics": {**times.public_metrics(), "total_time": total},
        }

    def headers(self, dispatch: Dispatch, answer: Answer) -> dict[str, str]:
        timing = answer.timing
        waited_ms = dispatch.waited_s * 1000 + (timing.queue_wait_ms or 0.0)
        headers = {
            "X-Queue-Wait-Ms": str(round(waited_ms)),
            "X-Conduit-Attempts": str(dispatch.attempt),
            "X-Processing-Time": decimal_seconds(time.perf_counter() - self.began),
            **timing.forwarded,
        }
        if timing.processing_s is not None:
            headers["X-Remote-Processing-Time"] = decimal_seconds(timing.processing_s)
        return headers

    def cancel_at_runner(self, dispatch: Dispatch) -> None:
        entry = self.lane.supply.runner(dispatch.runner_id)
        if entry is not None:
            client = self.lane.client(entry)
            self.lane.background.spawn(runner_call.cancel_quietly(client, self.id))


async def run(lane: Lane, request: RunRequest) -> RunResult:
    """Take ``request`` through the lane to its answer. Raises a lane error
    (``lane.errors``) when there is no run to answer."""
    call = LaneRun(lane, request)
    destination = request.placement
    shell = lane.shell
    cancel_after = request.cancel_after
    deadline = shell.now() + cancel_after if cancel_after else None
    try:
        band, account = band_of(request.priority), str(request.account_id)
        # No permit free here: borrow one of a runner whose permits are shared (lane.loans).
        runners = shell.borrowable(destination.lane)
        loan = await lane.loans.borrow(runners) if runners else None
        admission = shell.arrive(call.id, destination.lane, account, band, deadline, loan)
        if not admission.answer.done():  # granted (or refused) on arrival: nothing to wait for
            try:
                came = await call.departure.first(admission.answer)
            except BaseException:
                shell.leave(admission)
                raise
            if not came:
                shell.leave(admission)
                return Left()  # out of the queue; nobody reads the answer
        return await _attempts(call, admission.answer.result())
    finally:
        await call.departure.close()


async def _attempts(call: LaneRun, verdict: Dispatch | Reject | Fail) -> RunResult:
    """Call runners as the lane dispatches, until one answers or the lane gives up."""
    lane, request = call.lane, call.request
    last_error: str | None = None
    while True:
        if isinstance(verdict, Reject):
            raise refusal(verdict)
        if isinstance(verdict, Fail):
            error = verdict.error if last_error is None else f"{verdict.error} ({last_error})"
            call.record(Status.FAILED, None, error)
            raise RunFailed(f"The run failed on its runner(s): {error}.")
        dispatch = verdict
        answer = await _attempt(call, dispatch)
        if answer is None:
            _abandon(call, dispatch)
            return Left()
        if answer.outcome is Outcome.OK:
            if request.stream:
                return Streamed(_events(call, dispatch, answer), call.headers(dispatch, answer))
            lane.shell.done(dispatch, Outcome.OK, first_byte_sent=True)
            return await _finished(call, dispatch, answer)
        if answer.outcome is Outcome.UNAUTHORIZED:
            log.warning(
                "runner %s refused this server's runner token (CONDUIT_RUNNER_TOKEN differs):"
                " out of service on the lane: %s",
                dispatch.runner_id,
                answer.error,
            )
        else:
            log.info(
                "run %s: attempt %d on %s: %s",
                call.id,
                dispatch.attempt,
                dispatch.runner_id,
                answer.error,
            )
        last_error = answer.error
        next_verdict = lane.shell.done(
            dispatch, answer.outcome, first_byte_sent=False, retry_after=answer.retry_after
        )
        if next_verdict is None:
            raise RunFailed(answer.error or "the runner call failed")
        verdict = next_verdict


async def _attempt(call: LaneRun, dispatch: Dispatch) -> Answer | None:
    """One call to the dispatched runner; None when the client left while it worked."""
    lane, request = call.lane, call.request
    entry = lane.supply.runner(dispatch.runner_id)
    if entry is None:  # gone from the view between the dispatch and now
        return Answer(Outcome.FAILED, error="the runner left the fleet")
    call.hardware = entry.hardware
    call.started_at, call.dispatched = datetime.now(UTC), time.perf_counter()
    task = asyncio.ensure_future(
        runner_call.call(
            lane.client(entry),
            call.id,
            orjson.Fragment(request.runner_input_json or request.input_json),
            tenant=str(request.account_id),
            priority=request.priority.value,
            stream=request.stream,
        )
    )
    try:
        return await call.departure.or_leave(task)
    except asyncio.CancelledError:
        lane.shell.done(dispatch, Outcome.DISCONNECTED, first_byte_sent=False)
        raise


def _abandon(call: LaneRun, dispatch: Dispatch) -> None:
    """The client left while the runner worked (the call is cancelled): have the runner
    cancel the run, give the permit back, and record the run as canceled."""
    call.cancel_at_runner(dispatch)
    call.lane.shell.done(dispatch, Outcome.DISCONNECTED, first_byte_sent=False)
    call.record(Status.CANCELED, None, None)


async def _finished(call: LaneRun, dispatch: Dispatch, answer: Answer) -> Finished:
    prediction = answer.prediction
    assert prediction is not None
    try:
        prediction = await call.outputs.kept(prediction)
    except OutputNotKept as lost:
        prediction = failed(prediction, str(lost))
    status = Status(prediction.status.value)
    body = call.record(status, prediction, prediction.error)
    return Finished(body, call.headers(dispatch, answer))


async def _events(
    call: LaneRun, dispatch: Dispatch, answer: Answer
) -> AsyncGenerator[StreamEvent, None]:
    """The run's events, the permit held until they end."""
    converter = SnapshotEvents()
    outcome, error = Outcome.DISCONNECTED, None
    try:
        try:
            async with contextlib.aclosing(_relayed(call, dispatch, answer, converter)) as relayed:
                async for event in relayed:
                    yield event
            outcome, error = _closing(converter.last)
        except OutputNotKept as unkept:  # the runner is not at fault
            outcome, error = Outcome.OK, str(unkept)
        except Exception as failure:  # the runner's stream broke: the client is told
            outcome = Outcome.FAILED
            error = f"the runner failed after the response started: {failure!r}"
        for event in converter.end(_ended(outcome, converter.last).value, error):
            yield event
    finally:
        if answer.feed is not None:
            answer.feed.close()
        if outcome is Outcome.DISCONNECTED:
            call.cancel_at_runner(dispatch)
        call.lane.shell.done(dispatch, outcome, first_byte_sent=True)
        call.record(_ended(outcome, converter.last), converter.last, error)


async def _relayed(
    call: LaneRun, dispatch: Dispatch, answer: Answer, converter: SnapshotEvents
) -> AsyncGenerator[StreamEvent, None]:
    """The events of the runner's snapshots, up to the terminal one, each snapshot's large
    data URLs stored before its events leave. One that cannot be stored raises
    :class:`OutputNotKept`: the run ends as failed (``converter.last`` says so), and the
    runner is told to cancel it if it goes on."""
    async for snapshot in runner_call.snapshots(answer):
        try:
            kept = await call.outputs.kept(snapshot)
        except OutputNotKept as unkept:
            if not snapshot.status.is_terminal:
                call.cancel_at_runner(dispatch)
            converter.last = failed(snapshot, str(unkept))
            raise
        for event in converter.take(kept):
            yield event
        if kept.status.is_terminal:
            return


def _closing(last: PredictionResponse | None) -> tuple[Outcome, str | None]:
    """How a stream the runner ended went: ok with the run's own error, or failed when it
    ended before the run did."""
    if last is None or not last.status.is_terminal:
        return Outcome.FAILED, "the runner ended the stream before the run"
    return Outcome.OK, last.error


def _ended(outcome: Outcome, last: PredictionResponse | None) -> Status:
    """The recorded status of a streamed run that ended so."""
    if outcome is Outcome.DISCONNECTED:
        return Status.CANCELED
    if outcome is Outcome.FAILED or last is None or not last.status.is_terminal:
        return Status.FAILED
    return Status(last.status.value)
