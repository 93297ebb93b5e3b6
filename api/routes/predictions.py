"""Prediction routes: thin; the logic lives in ``api.serving``."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request

from api import serving
from api.bodies import read_body
from api.deadlines import parse_cancel_after
from api.deps import AccountDep, Resources, ResourcesDep, caller
from api.idempotency import from_request
from api.openapi import (
    CREATE_HEADERS,
    CREATED_HEADERS,
    operation,
    problems,
    request_body,
)
from api.prediction_filters import parse_filters
from api.prefer import WaitEnd, parse_wait, wait_or_disconnect
from api.priority import parse_priority_header
from api.protocol import PredictionCreate
from api.responses import FastJSONResponse
from api.schemas import Prediction, PredictionPage
from api.timing import timing_headers
from front.destinations import Destination
from tracker.render import PredictionLinks, prediction_urls, render_prediction
from tracker.states import Status

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)

AFTER = "Only predictions created after this ISO 8601 date-time (UTC when it has no offset)."
BEFORE = "Only predictions created before this ISO 8601 date-time (UTC when it has no offset)."
SOURCE = "Only predictions from this source: `api`, `web` or `sync` (the `/run` lane)."


def _create(*statuses: int) -> dict[str, Any]:
    """What a create route declares besides its path: body, headers, problems (``api.openapi``).
    The route reads its own body and caller (:func:`api.bodies.read_body`,
    :func:`api.deps.caller`); the document names them all the same."""
    created = {"description": "The prediction, created (or replayed).", "headers": CREATED_HEADERS}
    return {
        "status_code": 201,
        "response_model": Prediction,
        "responses": {201: created, **problems(400, 401, *statuses, 409, 413, 422, 429, 503)},
        "openapi_extra": {
            **operation(*CREATE_HEADERS),
            "requestBody": request_body(PredictionCreate),
        },
    }


async def _created(
    request: Request,
    resources: Resources,
    account: AccountDep,
    destination: Destination,
    body: PredictionCreate,
) -> FastJSONResponse:
    began = time.perf_counter()
    wait = parse_wait(request.headers.get("prefer"))
    cancel_after = parse_cancel_after(request.headers.get("cancel-after"))
    priority = parse_priority_header(request.headers.get("x-priority"))
    idempotency = from_request(
        request.headers.get("idempotency-key"),
        account.id,
        version_id=destination.version.id,
        deployment=destination.deployment,
        body=body,
        cancel_after=cancel_after,
        priority=priority,
    )
    row, replayed = await serving.create(
        resources, account, destination, body, cancel_after, idempotency, priority
    )
    # Stored from here on: whatever fails now, the client gets 201 with the prediction, so it
    # never retries to learn that it exists (and never runs it twice).
    base = resources.links(request)
    headers: dict[str, str] = {"Idempotent-Replayed": "true"} if replayed else {}
    try:
        if wait is None:
            return _respond(render_prediction(row, base), headers)
        seconds, applied = wait
        prediction, waited = await _waited(request, resources, account, row, base, seconds)
        if waited:
            headers["Preference-Applied"] = applied
        forward = resources.settings.remote_time_forwarding
        headers.update(timing_headers(prediction, time.perf_counter() - began, forward))
        return _respond(prediction, headers)
    except Exception:
        log.exception("prediction %s stored; answering it as stored", row["id"])
        return _respond(_as_stored(row, base), headers)


def _as_stored(row: Mapping[Any, Any], base: PredictionLinks) -> dict[str, Any]:
    try:
        return render_prediction(row, base)
    except Exception:
        log.exception("prediction %s could not be rendered", row["id"])
        return {"id": row["id"], "status": row["status"], "urls": prediction_urls(base, row["id"])}


async def _waited(
    request: Request,
    resources: Resources,
    account: AccountDep,
    row: Mapping[Any, Any],
    base: PredictionLinks,
    seconds: int,
) -> tuple[dict[str, Any], bool]:
    """The prediction as a ``Prefer: wait`` create answers it, after waiting up to ``seconds``,
    and whether it waited (not when the process held its most waiters already)."""
    # A replay waits like the first request did, unless its prediction already finished.
    if Status(row["status"]).is_terminal:
        return render_prediction(row, base), True
    waited = await wait_or_disconnect(request, resources.hub, row["id"], seconds, account.id)
    if waited.prediction is not None:
        finished: dict[str, Any] = orjson.loads(waited.prediction)  # as written: no re-read
        finished["urls"] = prediction_urls(base, finished["id"])
        return finished, True
    if waited.end is WaitEnd.CLIENT_LEFT:
        return render_prediction(row, base), True  # nobody reads it
    if waited.end is WaitEnd.DECLINED:
        return _starting(row, base), False
    try:
        row = await serving.get(resources, account, row["id"])
    except Exception:
        log.exception("prediction %s: re-read after the wait failed", row["id"])
    # Replicate's rule, which the official clients rely on: a wait that ends before the
    # prediction does answers "starting"; anything else reads as final.
    return _starting(row, base), True


def _starting(row: Mapping[Any, Any], base: PredictionLinks) -> dict[str, Any]:
    if Status(row["status"]).is_terminal:
        return render_prediction(row, base)
    return render_prediction({**row, "status": Status.STARTING.value}, base)


def _respond(prediction: dict[str, Any], headers: dict[str, str]) -> FastJSONResponse:
    headers["Location"] = prediction["urls"]["get"]
    return FastJSONResponse(prediction, status_code=201, headers=headers)


@router.post("/predictions", **_create())
async def create_prediction(request: Request) -> FastJSONResponse:
    resources, account = await caller(request)
    body = await read_body(request, PredictionCreate)
    destination = await resources.front.resolver.version_field(account, body.version)
    return await _created(request, resources, account, destination, body)


@router.post("/models/{owner}/{name}/predictions", **_create(404))
async def create_model_prediction(request: Request, owner: str, name: str) -> FastJSONResponse:
    resources, account = await caller(request)
    body = await read_body(request, PredictionCreate)
    destination = await resources.front.resolver.model(account, owner, name)
    return await _created(request, resources, account, destination, body)


@router.post("/deployments/{owner}/{name}/predictions", **_create(404))
async def create_deployment_prediction(request: Request, owner: str, name: str) -> FastJSONResponse:
    resources, account = await caller(request)
    body = await read_body(request, PredictionCreate)
    destination = await resources.front.resolver.deployment(account, owner, name)
    return await _created(request, resources, account, destination, body)


@router.get(
    "/predictions",
    response_model=PredictionPage,
    responses=problems(400, 401, 503),
    openapi_extra=operation(),
)
async def list_predictions(
    request: Request,
    account: AccountDep,
    resources: ResourcesDep,
    cursor: str | None = None,
    created_after: Annotated[str | None, Query(description=AFTER)] = None,
    created_before: Annotated[str | None, Query(description=BEFORE)] = None,
    source: Annotated[str | None, Query(description=SOURCE)] = None,
) -> FastJSONResponse:
    """Newest first, 100 a page; the filters apply to every page the links lead to."""
    filters = parse_filters(
        {"created_after": created_after, "created_before": created_before, "source": source}
    )
    base = resources.links(request)
    return FastJSONResponse(await serving.list_page(resources, account, base, cursor, filters))


@router.get(
    "/predictions/{prediction_id}",
    response_model=Prediction,
    responses=problems(400, 401, 404, 503),
    openapi_extra=operation(),
)
async def get_prediction(
    request: Request, prediction_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    row = await serving.get(resources, account, prediction_id, replica=True)
    return FastJSONResponse(render_prediction(row, resources.links(request)))


@router.post(
    "/predictions/{prediction_id}/cancel",
    response_model=Prediction,
    responses=problems(400, 401, 404, 503),
    openapi_extra=operation(),
)
async def cancel_prediction(
    request: Request, prediction_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    base = resources.links(request)
    row = await serving.cancel(resources, account, prediction_id, base)
    return FastJSONResponse(render_prediction(row, base))
