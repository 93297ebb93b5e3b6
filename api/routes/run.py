"""``POST /v1/deployments/{owner}/{name}/run`` and ``POST /v1/models/{owner}/{name}/run``: the
synchronous lane (``api.lane``).

The answer is the run itself: ``{"id", "status", "output", "error", "metrics"}``, 200 once
the runner answered (a prediction that failed is still answered: ``status: "failed"``), or, with
``Accept: text/event-stream``, its events as the model produces them (the prediction
stream's ``output``, ``logs``, ``error``, ``done``). Authentication, destination and input
validation are the create endpoints' own (``api.serving``). Nothing is stored or queued before
the runner is called: the run is recorded after the answer (``api.lane.record``).

Order of work, cheapest refusal first: the token, the destination (catalog cache), then the
lane's verdict from the path alone (no runner, queue full: 429 ``out_of_capacity`` without
reading the body), then the body, then a permit (waiting in the bounded queue), then the
runner. A client that disconnects leaves the queue at once, or has its run canceled at the
runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sse_starlette import EventSourceResponse, ServerSentEvent

from api import serving
from api.deadlines import parse_cancel_after
from api.deps import Resources, get_account, get_resources, limit_creates
from api.errors import Problem, Unavailable, undecodable_body
from api.json_input import canonical_input
from api.lane import runner_call
from api.lane.events import Dispatch, Fail, Outcome, Reject, RejectReason, band_of
from api.lane.runner_call import Answer
from api.lane.service import Lane
from api.lane.shell import Admission
from api.lane.stream_events import SnapshotEvents
from api.openapi import (
    OUT_OF_CAPACITY,
    RUN_HEADERS,
    RUN_REQUEST_HEADERS,
    STREAM_EVENT,
    operation,
    problems,
)
from api.priority import honoured, parse_priority_header
from api.protocol import _has_nul
from api.responses import FastJSONResponse
from api.timing import seconds
from api.validation import check_input
from conduit.logging_setup import REQUEST_ID
from runners.protocol import PredictionResponse, Priority
from tracker.batch_writes import SyncRun
from tracker.catalog import AccountInfo
from tracker.ids import new_prediction_id
from tracker.render import storable_text
from tracker.states import Status
from tracker.usage import UNKNOWN_HARDWARE, RunnerTimes

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)

EVENT_STREAM = "text/event-stream"


class OutOfCapacity(Problem):
    status = 429
    title = "Too Many Requests"

    _DETAIL = {
        RejectReason.OUT_OF_CAPACITY: "Capacity temporarily exceeded: the queue is full.",
        RejectReason.EXPIRED: "Capacity temporarily exceeded: no runner freed up in time.",
        RejectReason.NO_RUNNER: "No runner serves this model now.",
    }

    def __init__(self, reject: Reject) -> None:
        super().__init__(
            self._DETAIL[reject.reason],
            headers={"Retry-After": str(reject.retry_after_s)},
            code="out_of_capacity",
        )


class RunnerFailed(Problem):
    status = 502
    title = "Bad Gateway"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, code="runner_failed")


class RunCreate(BaseModel):
    """Body of ``/run``: the model's input. Unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    input: dict[str, Any] = Field(description="The model's input, as for a prediction.")

    @field_validator("input")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        if _has_nul(value):
            raise ValueError("must not contain NUL (\\u0000) characters")
        return value


class Run(BaseModel):
    """A finished run, as ``/run`` answers it (also listed as a prediction, source sync)."""

    id: str = Field(description="The prediction id it is recorded under.")
    status: Literal["succeeded", "failed", "canceled"]
    output: Any = None
    error: str | None = None
    metrics: dict[str, float] = Field(
        description="predict_time (and queue_wait_time, gpu_time) as the runner reported "
        "them, and total_time."
    )


def _run_doc(*statuses: int) -> dict[str, Any]:
    ok = {
        "description": "The finished run; with Accept: text/event-stream, its events as they "
        "happen (output, logs, error, done).",
        "headers": RUN_HEADERS,
        "content": {EVENT_STREAM: {"itemSchema": STREAM_EVENT}},
    }
    body = {
        "required": True,
        "content": {"application/json": {"schema": RunCreate.model_json_schema()}},
    }
    return {
        "response_model": Run,
        "responses": {
            200: ok,
            **problems(400, 401, *statuses, 413, 422, 502, 503),
            429: OUT_OF_CAPACITY,
        },
        "openapi_extra": {**operation(*RUN_REQUEST_HEADERS), "requestBody": body},
    }


@router.post("/deployments/{owner}/{name}/run", **_run_doc(404))
async def run_deployment(request: Request, owner: str, name: str) -> Response:
    resources, account = await _caller(request)
    lane = _lane(resources)
    destination = await serving.resolve_deployment(resources, account, owner, name)
    assert destination.deployment is not None
    return await _run(request, resources, lane, account, destination, destination.deployment)


@router.post("/models/{owner}/{name}/run", **_run_doc(404))
async def run_model(request: Request, owner: str, name: str) -> Response:
    resources, account = await _caller(request)
    lane = _lane(resources)
    destination = await serving.resolve_model(resources, account, owner, name)
    version = destination.version.id
    lane_name = lane.supply.lane_for_version(version) or f"version:{version}"
    return await _run(request, resources, lane, account, destination, lane_name)


async def _caller(request: Request) -> tuple[Resources, AccountInfo]:
    """The resources and the authenticated account, as ``ResourcesDep`` and ``AccountDep``
    give them: called here rather than declared, as FastAPI's dependency solving was a
    measurable part of a ``/run``'s own time."""
    resources = await get_resources(request)
    account = await get_account(request, resources)
    await limit_creates(resources, account)  # the account's rate of creates: 429 past it
    return resources, account


def _lane(resources: Resources) -> Lane:
    if resources.lane is None:
        raise Unavailable("The synchronous lane is not running on this server.")
    return resources.lane


async def _body(request: Request) -> RunCreate:
    """The body, refused as the create endpoints refuse theirs (FastAPI's way: JSON first,
    then the model in Python mode; the same problem bodies)."""
    raw = await request.body()
    if not raw:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = _json_or_problem(raw)  # what orjson refuses (NaN, big integers) json may take
    try:
        return RunCreate.model_validate(data)
    except ValidationError as error:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in error.errors()]
        ) from None


def _json_or_problem(raw: bytes) -> Any:
    """``raw`` as FastAPI's JSON reading takes it, or its 422."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        invalid = {
            "type": "json_invalid",
            "loc": ("body", error.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": error.msg},
        }
        raise RequestValidationError([invalid]) from None
    except UnicodeDecodeError as error:
        raise undecodable_body(error) from None


def _wants_events(accept: str | None) -> bool:
    return any(p.split(";")[0].strip().lower() == EVENT_STREAM for p in (accept or "").split(","))


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Run:
    """One ``/run`` request on its way through the lane and to a runner."""

    def __init__(
        self,
        request: Request,
        lane: Lane,
        account: AccountInfo,
        destination: serving.Destination,
        priority: Priority,
        body: RunCreate,
        input_json: bytes,
    ) -> None:
        self.request = request
        self.lane = lane
        self.account = account
        self.destination = destination
        self.priority = priority
        self.input = body.input
        self.input_json = input_json
        self.id = new_prediction_id()
        self.began = time.perf_counter()
        self.created_at = datetime.now(UTC)
        self.started_at: datetime | None = None
        self.dispatched = 0.0
        self.hardware = UNKNOWN_HARDWARE

    # --- the record --------------------------------------------------------------------------

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
        destination = self.destination
        run = SyncRun(
            id=self.id,
            account_id=self.account.id,
            model=destination.version.model,
            version_id=destination.version.id,
            deployment_id=destination.deployment_id,
            deployment=destination.deployment,
            target=destination.target.name,
            input=orjson.Fragment(self.input_json),
            status=status,
            output=output,
            logs=storable_text(logs) if logs else None,
            error=storable_text(error) if error is not None else None,
            times=times,
            hardware=self.hardware,
            created_at=self.created_at,
            started_at=self.started_at,
            completed_at=completed,
            priority=self.priority.value,
            request_id=REQUEST_ID.get(),
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
            "X-Processing-Time": seconds(time.perf_counter() - self.began),
            **timing.forwarded,
        }
        if timing.processing_s is not None:
            headers["X-Remote-Processing-Time"] = seconds(timing.processing_s)
        return headers


async def _run(
    request: Request,
    resources: Resources,
    lane: Lane,
    account: AccountInfo,
    destination: serving.Destination,
    lane_name: str,
) -> Response:
    cancel_after = parse_cancel_after(request.headers.get("cancel-after"))
    requested = parse_priority_header(request.headers.get("x-priority"))
    priority = (
        honoured(requested, account.may_use_high_priority, destination.allow_high_priority)
        or Priority.NORMAL
    )
    band = band_of(priority)
    account_key = str(account.id)
    early = lane.shell.refuse_early(lane_name, account_key, band)
    if early is not None:
        raise OutOfCapacity(early)
    body = await _body(request)
    input_json = canonical_input(body.input, resources.settings.max_input_depth)
    check_input(destination.validator, body.input)
    run = _Run(request, lane, account, destination, priority, body, input_json)
    deadline = lane.shell.now() + cancel_after.total_seconds() if cancel_after else None
    departure = _Departure(request)
    try:
        admission = lane.shell.arrive(run.id, lane_name, account_key, band, deadline)
        verdict = await _admitted(lane, admission, departure)
        if verdict is None:
            return Response(status_code=499)  # nobody reads it
        events = _wants_events(request.headers.get("accept"))
        return await _attempts(run, verdict, departure, events)
    finally:
        await departure.close()


#: A runner call still going after this long (s) has its client watched from then on: a run
#: that ends sooner is over before a cancel could reach its runner anyway.
WATCH_AFTER = 0.02


class _Departure:
    """Notices the client leaving (``http.disconnect`` on the receive channel).

    Reading the channel takes a task of its own, a few scheduling rounds of the event loop on
    every request; so it starts only when a wait may be long: at once for a request that has
    to queue, :data:`WATCH_AFTER` into a runner call."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self.watcher: asyncio.Task[None] | None = None

    def watch(self) -> asyncio.Task[None]:
        if self.watcher is None:
            self.watcher = asyncio.ensure_future(_disconnected(self._request))
        return self.watcher

    async def close(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watcher


async def _first(*futures: asyncio.Future[Any]) -> None:
    await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)


async def _admitted(
    lane: Lane, admission: Admission, departure: _Departure
) -> Dispatch | Reject | Fail | None:
    """The lane's first answer; None when the client left first (out of the queue then)."""
    if admission.answer.done():  # granted (or refused) on arrival: nothing to wait for
        return admission.answer.result()
    try:
        await _first(admission.answer, departure.watch())
    except BaseException:
        lane.shell.leave(admission)
        raise
    if admission.answer.done():
        return admission.answer.result()
    lane.shell.leave(admission)
    return None


async def _answer_or_leave(call: asyncio.Task[Answer], departure: _Departure) -> Answer | None:
    """The runner call's answer; None when the client left first (the call cancelled)."""

    def leave(_: object) -> None:
        call.cancel()

    def watch() -> None:
        departure.watch().add_done_callback(leave)

    timer = None
    if departure.watcher is None:
        timer = asyncio.get_running_loop().call_later(WATCH_AFTER, watch)
    else:
        departure.watcher.add_done_callback(leave)
    try:
        return await call
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this handler is cancelled itself (shutdown): not the client leaving
        return None
    finally:
        if timer is not None:
            timer.cancel()
        if departure.watcher is not None:
            departure.watcher.remove_done_callback(leave)


async def _attempts(
    run: _Run, verdict: Dispatch | Reject | Fail, departure: _Departure, events: bool
) -> Response:
    """Call runners as the lane dispatches, until one answers or the lane gives up."""
    lane = run.lane
    while True:
        if isinstance(verdict, Reject):
            raise OutOfCapacity(verdict)
        if isinstance(verdict, Fail):
            run.record(Status.FAILED, None, verdict.error)
            raise RunnerFailed(f"The run failed on its runner(s): {verdict.error}.")
        dispatch = verdict
        entry = lane.supply.runner(dispatch.runner_id)
        if entry is None:  # gone from the view between the dispatch and now
            answer = Answer(Outcome.FAILED, error="the runner left the fleet")
        else:
            run.hardware = entry.hardware
            run.started_at, run.dispatched = datetime.now(UTC), time.perf_counter()
            call = asyncio.ensure_future(
                runner_call.call(
                    lane.client(entry),
                    run.id,
                    orjson.Fragment(run.input_json),
                    tenant=str(run.account.id),
                    priority=run.priority.value,
                    stream=events,
                )
            )
            try:
                left = await _answer_or_leave(call, departure)
            except asyncio.CancelledError:
                lane.shell.done(dispatch, Outcome.DISCONNECTED, first_byte_sent=False)
                raise
            if left is None:
                _abandon(run, dispatch)
                return Response(status_code=499)
            answer = left
        if answer.outcome is Outcome.OK:
            if events:
                return _event_stream(run, dispatch, answer)
            lane.shell.done(dispatch, Outcome.OK, first_byte_sent=True)
            return _json_answer(run, dispatch, answer)
        log.info(
            "run %s: attempt %d on %s: %s",
            run.id,
            dispatch.attempt,
            dispatch.runner_id,
            answer.error,
        )
        next_verdict = lane.shell.done(
            dispatch, answer.outcome, first_byte_sent=False, retry_after=answer.retry_after
        )
        if next_verdict is None:
            raise RunnerFailed(answer.error or "the runner call failed")
        verdict = next_verdict


def _abandon(run: _Run, dispatch: Dispatch) -> None:
    """The client left while the runner worked (the call is cancelled): have the runner
    cancel the run, give the permit back, and record the run as canceled."""
    _cancel_at_runner(run, dispatch)
    run.lane.shell.done(dispatch, Outcome.DISCONNECTED, first_byte_sent=False)
    run.record(Status.CANCELED, None, None)


def _cancel_at_runner(run: _Run, dispatch: Dispatch) -> None:
    entry = run.lane.supply.runner(dispatch.runner_id)
    if entry is not None:
        _background(runner_call.cancel_quietly(run.lane.client(entry), run.id))


_BACKGROUND: set[asyncio.Task[None]] = set()


def _background(work: Any) -> None:
    task = asyncio.ensure_future(work)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _json_answer(run: _Run, dispatch: Dispatch, answer: Answer) -> Response:
    prediction = answer.prediction
    assert prediction is not None
    status = Status(prediction.status.value)
    body = run.record(status, prediction, prediction.error)
    return FastJSONResponse(body, headers=run.headers(dispatch, answer))


def _event_stream(run: _Run, dispatch: Dispatch, answer: Answer) -> EventSourceResponse:
    """The run's events, the permit held until the stream ends."""

    async def events() -> AsyncIterator[ServerSentEvent]:
        converter = SnapshotEvents()
        outcome, error = Outcome.DISCONNECTED, None
        try:
            try:
                async for snapshot in runner_call.snapshots(answer):
                    for kind, data, event_id in converter.take(snapshot):
                        yield ServerSentEvent(data, event=kind, id=event_id)
                    if snapshot.status.is_terminal:
                        break
                last = converter.last
                if last is None or not last.status.is_terminal:
                    outcome, error = Outcome.FAILED, "the runner ended the stream before the run"
                else:
                    outcome, error = Outcome.OK, last.error
            except Exception as failure:  # the runner's stream broke: the client is told
                outcome = Outcome.FAILED
                error = f"the runner failed after the response started: {failure!r}"
            for kind, data, event_id in converter.end(_ended(outcome, converter.last).value, error):
                yield ServerSentEvent(data, event=kind, id=event_id)
        finally:
            if answer.feed is not None:
                answer.feed.close()
            if outcome is Outcome.DISCONNECTED:
                _cancel_at_runner(run, dispatch)
            run.lane.shell.done(dispatch, outcome, first_byte_sent=True)
            run.record(_ended(outcome, converter.last), converter.last, error)

    return EventSourceResponse(
        events(),
        headers={"Cache-Control": "no-store", **run.headers(dispatch, answer)},
    )


def _ended(outcome: Outcome, last: PredictionResponse | None) -> Status:
    """The recorded status of a streamed run that ended so."""
    if outcome is Outcome.DISCONNECTED:
        return Status.CANCELED
    if outcome is Outcome.FAILED or last is None or not last.status.is_terminal:
        return Status.FAILED
    return Status(last.status.value)
