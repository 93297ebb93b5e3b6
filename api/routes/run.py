"""``POST /v1/deployments/{owner}/{name}/run`` and ``POST /v1/models/{owner}/{name}/run``: the
synchronous lane (:mod:`lane`).

The answer is the run itself: ``{"id", "status", "output", "error", "metrics"}``, 200 once
the runner answered (a prediction that failed is still answered: ``status: "failed"``), or, with
``Accept: text/event-stream``, its events as the model produces them (the prediction
stream's ``output``, ``logs``, ``error``, ``done``). Authentication, destination and input
validation are the create endpoints' own (``api.serving``). Nothing is stored or queued before
the runner is called: the run is recorded after the answer (``lane.run_recorder``).

Order of work, cheapest refusal first: the token, the destination (catalog cache), then the
lane's verdict from the path alone (no runner, queue full: 429 ``out_of_capacity`` without
reading the body), then the body, then a permit (waiting in the bounded queue), then the
runner. This module does the HTTP half (the first, and the body); it hands the lane a plain
:class:`lane.request.RunRequest` for the rest, and renders what the lane answers. The lane's
refusals (``lane.errors``) become problem+json in ``api.errors``.

Files as on the durable path: each file reference in the input reaches the runner as a signed
delivery URL (the run is recorded with the input as given), and each data URL of the answer
above the files' ``inline_max`` is stored and answered as its URL (``lane.outputs``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sse_starlette import EventSourceResponse, ServerSentEvent

from api.bodies import read_body
from api.deadlines import parse_cancel_after
from api.deps import Resources, caller
from api.openapi import (
    OUT_OF_CAPACITY,
    RUN_HEADERS,
    RUN_REQUEST_HEADERS,
    STREAM_EVENT,
    operation,
    problems,
    request_body,
)
from api.prefer import disconnected
from api.priority import parse_priority_header
from api.protocol import check_storable
from api.responses import FastJSONResponse
from catalog.records import AccountInfo
from core.logs import REQUEST_ID
from core.nesting import DEPTH_CEILING
from files.data_urls import DataUrls
from front import lanes
from front.admission import honoured
from front.destinations import Destination
from lane.errors import LaneNotRunning
from lane.request import Finished, RunRequest, Streamed
from lane.service import Lane
from protocol.values import Priority

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)

EVENT_STREAM = "text/event-stream"


class RunCreate(BaseModel):
    """Body of ``/run``: the model's input. Unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    input: dict[str, Any] = Field(description="The model's input, as for a prediction.")

    @field_validator("input")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        check_storable(value, "input", DEPTH_CEILING)
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
    return {
        "response_model": Run,
        "responses": {
            200: ok,
            **problems(400, 401, *statuses, 413, 422, 502, 503),
            429: OUT_OF_CAPACITY,
        },
        "openapi_extra": {
            **operation(*RUN_REQUEST_HEADERS),
            "requestBody": request_body(RunCreate),
        },
    }


@router.post("/deployments/{owner}/{name}/run", **_run_doc(404))
async def run_deployment(request: Request, owner: str, name: str) -> Response:
    resources, account = await caller(request)
    lane = _lane(resources)
    destination = await resources.front.resolver.deployment(account, owner, name)
    return await _run(request, resources, lane, account, destination)


@router.post("/models/{owner}/{name}/run", **_run_doc(404))
async def run_model(request: Request, owner: str, name: str) -> Response:
    resources, account = await caller(request)
    lane = _lane(resources)
    destination = await resources.front.resolver.model(account, owner, name)
    return await _run(request, resources, lane, account, destination)


def _lane(resources: Resources) -> Lane:
    if resources.lane is None:
        raise LaneNotRunning()
    return resources.lane


async def _run(
    request: Request,
    resources: Resources,
    lane: Lane,
    account: AccountInfo,
    destination: Destination,
) -> Response:
    cancel_after = parse_cancel_after(request.headers.get("cancel-after"))
    requested = parse_priority_header(request.headers.get("x-priority"))
    priority = (
        honoured(requested, account.may_use_high_priority, destination.allow_high_priority)
        or Priority.NORMAL
    )
    placement = lanes.placement(lane, destination)
    lane.refuse_early(placement.lane, account.id, priority)
    body = await read_body(request, RunCreate)
    admission = resources.front.admission
    input_json = admission.input(destination, body.input)
    linked = await admission.files(account.id, body.input, resources.base_url(request))
    runner_input_json = None  # recorded as given; the runner gets signed delivery URLs
    if linked is not body.input:
        runner_input_json = admission.canonical(linked)
    result = await lane.run(
        RunRequest(
            placement=placement,
            account_id=account.id,
            priority=priority,
            input_json=input_json,
            stream=_wants_events(request.headers.get("accept")),
            left=functools.partial(disconnected, request),
            cancel_after=cancel_after.total_seconds() if cancel_after else None,
            request_id=REQUEST_ID.get(),
            runner_input_json=runner_input_json,
            output_files=_output_files(resources, request),
        )
    )
    if isinstance(result, Finished):
        return FastJSONResponse(result.body, headers=result.headers)
    if isinstance(result, Streamed):
        headers = {"Cache-Control": "no-store", **result.headers}
        return EventSourceResponse(_server_sent(result), headers=headers)
    return Response(status_code=499)  # the client left: nobody reads it


def _output_files(resources: Resources, request: Request) -> DataUrls | None:
    """Where the run's large data URLs go: the file store, as for a queued prediction; their
    URLs under the api this request arrived at (unless a public URL is set)."""
    files = resources.files
    if files is None:
        return None
    files = files.at(resources.base_url(request))
    return DataUrls(files, files.settings.inline_max)


async def _server_sent(result: Streamed) -> AsyncIterator[ServerSentEvent]:
    """The lane's events as server-sent events; closing this closes the lane's stream (which
    gives its permit back and records the run)."""
    try:
        async for kind, data, event_id in result.events:
            yield ServerSentEvent(data, event=kind, id=event_id)
    finally:
        await result.events.aclose()


def _wants_events(accept: str | None) -> bool:
    return any(p.split(";")[0].strip().lower() == EVENT_STREAM for p in (accept or "").split(","))
