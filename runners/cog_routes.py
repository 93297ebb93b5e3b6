"""The handlers of Cog's runner routes (coglet 0.23.1 on the wire): predictions (sync,
``respond-async`` and snapshot streams), cancel, shutdown, health check, schema and discovery.

They parse the request, ask :class:`runners.service.RunnerService` (found as ``app[SERVICE]``)
and answer as coglet does, a refusal (:mod:`runners.errors`) in coglet's body or problem+json
(:func:`runners.problems.refusal`); every prediction response carries the timing headers. They
do not poll (there is no ``GET /predictions/{id}``) or keep finished predictions:
deduplicating across completion is the platform's job. :mod:`runners.server` mounts them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pydantic
from aiohttp import web

from protocol.documents import PredictionRequest
from protocol.headers import (
    ACCEPT,
    ATTACH,
    CACHE_HIT,
    CACHE_MODE,
    CACHE_TAG,
    CACHE_TOKENS_REUSED,
    GPU_TIME_MS,
    IF_MATCH,
    JSON,
    NDJSON,
    PRIORITY,
    PROCESSING_TIME,
    QUEUE_WAIT_MS,
    TENANT_ID,
    TRACE_HEADERS,
)
from protocol.paths import (
    CANCEL_PATH,
    DOCS_PATH,
    HEALTH_CHECK_PATH,
    OPENAPI_PATH,
    PREDICTION_PATH,
    PREDICTIONS_PATH,
    SHUTDOWN_PATH,
)
from protocol.values import Priority, RunnerStatus
from runners import COG_VERSION
from runners.admission import RequestOptions
from runners.auth import require_internal
from runners.cache import CacheMode
from runners.errors import NotRunningError, RequestRefused
from runners.prediction import Prediction
from runners.prefer import respond_async
from runners.problems import refusal
from runners.state import SERVICE
from runners.streaming import SnapshotStream, wants_stream

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_PREDICTION = web.RequestKey("prediction", Prediction)
"""The prediction a request created or found, for :func:`_timed` to report on."""
_BEGAN = web.RequestKey("began", float)
"""When :func:`_timed` saw the request (monotonic clock)."""

_DISCOVERY = {
    "cog_version": COG_VERSION,
    "docs_url": DOCS_PATH,
    "healthcheck_url": HEALTH_CHECK_PATH,
    "openapi_url": OPENAPI_PATH,
    "predictions_cancel_url": CANCEL_PATH.format(id="{prediction_id}"),
    "predictions_idempotent_url": PREDICTION_PATH.format(id="{prediction_id}"),
    "predictions_url": PREDICTIONS_PATH,
    "shutdown_url": SHUTDOWN_PATH,
}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # coglet serialises through a sorted map; match its key order byte for byte.
    data = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    return web.Response(body=data, status=status, content_type=JSON, headers=headers)


async def _parse_request(request: web.Request) -> PredictionRequest:
    """The body as coglet reads it: empty means no input; bad JSON is 400 ``text/plain``."""
    raw = await request.read()
    if not raw.strip():
        return PredictionRequest()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        text = f"Failed to parse the request body as JSON: {error}"
        raise web.HTTPBadRequest(text=text) from error
    try:
        if isinstance(data, dict) and data.get("input") is None:
            data["input"] = {}  # coglet treats "input": null as no input
        return PredictionRequest.model_validate(data)
    except pydantic.ValidationError as error:
        text = f"Failed to deserialize the JSON body into the target type: {error}"
        raise web.HTTPUnprocessableEntity(text=text) from error


def _options(request: web.Request) -> RequestOptions:
    headers = request.headers
    try:
        mode = CacheMode((headers.get(CACHE_MODE) or "default").strip().lower())
    except ValueError:
        modes = ", ".join(m.value for m in CacheMode)
        raise web.HTTPBadRequest(text=f"{CACHE_MODE} must be one of {modes}") from None
    return RequestOptions(
        tenant=(headers.get(TENANT_ID) or "default").strip() or "default",
        priority=Priority.parse(headers.get(PRIORITY)),
        cache_mode=mode,
        cache_tag=headers.get(CACHE_TAG) or None,
        stream=wants_stream(headers.get(ACCEPT)),
    )


def _timing_headers(prediction: Prediction | None, began: float) -> dict[str, str]:
    """The figures a caller may bill or schedule by; zero and false when no prediction ran."""
    queue_wait = gpu_time = 0.0
    hit, reused = False, 0
    if prediction is not None:
        queue_wait = prediction.queue_wait_time if prediction.ticket.granted_at else 0.0
        gpu_time, hit, reused = prediction.gpu_time, prediction.cache_hit, prediction.tokens_reused
    return {
        QUEUE_WAIT_MS: str(round(queue_wait * 1000)),
        GPU_TIME_MS: str(round(gpu_time * 1000)),
        PROCESSING_TIME: f"{time.monotonic() - began:.6f}",
        CACHE_HIT: "true" if hit else "false",
        CACHE_TOKENS_REUSED: str(reused),
    }


def _timed(handler: Handler) -> Handler:
    """Put the timing headers on every response of a prediction route, refusals and errors
    (bad JSON, a bad ``X-Cache-Mode``, an id mismatch) included."""

    async def timed(request: web.Request) -> web.StreamResponse:
        began = request[_BEGAN] = time.monotonic()
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as error:
            error.headers.update(_timing_headers(request.get(_PREDICTION), began))
            raise
        except RequestRefused as error:
            response = refusal(error)
        if not response.prepared:  # a snapshot stream sent its headers when it began
            response.headers.update(_timing_headers(request.get(_PREDICTION), began))
        return response

    return timed


async def _run(
    request: web.Request, prediction_id: str, body: PredictionRequest
) -> web.StreamResponse:
    service = request.app[SERVICE]
    options = _options(request)
    attach = request.headers.get(IF_MATCH, "").strip() == ATTACH
    if attach:
        require_internal(request, "attach")
    if (existing := service.get(prediction_id)) is not None:
        request[_PREDICTION] = existing
        if options.stream:  # a director that took it over: its snapshots go there now
            require_internal(request, "taking over a running prediction")
            stream = SnapshotStream(body.webhook_events_filter, fallback=service.fallback(body))
            existing.redirect(stream)
            return await _stream(request, stream, {})
        return _json(existing.snapshot(with_input=True), 202)
    if attach:
        raise NotRunningError(prediction_id)  # attach only: nothing may start
    trace = {k: v for k in TRACE_HEADERS if (v := request.headers.get(k))}
    try:
        admitted = service.submit(prediction_id, body, trace, options)
    except RequestRefused as error:
        service.refused(options.tenant, error.reason)
        raise
    prediction = request[_PREDICTION] = admitted.prediction
    rate = {} if admitted.rate is None else admitted.rate.headers()
    if admitted.stream is not None:
        return await _stream(request, admitted.stream, rate)
    if respond_async(request.headers):
        return _json({"id": prediction_id, "status": RunnerStatus.STARTING}, 202, rate)
    try:
        await asyncio.shield(prediction.wait())
    except asyncio.CancelledError:
        # The client went away: a sync prediction nobody will read is canceled, as in coglet.
        prediction.cancel()
        raise
    return _json(prediction.snapshot(), 200, rate)


async def _stream(
    request: web.Request, stream: SnapshotStream, headers: dict[str, str]
) -> web.StreamResponse:
    """Answer with the prediction's snapshots as they happen (:mod:`runners.streaming`).

    Unlike a synchronous request, a client that hangs up does not cancel the prediction: the
    rest of its snapshots go to its webhook.
    """
    timing = _timing_headers(request[_PREDICTION], request[_BEGAN])
    response = web.StreamResponse(status=200, headers={**headers, **timing})
    response.content_type = NDJSON
    try:
        await response.prepare(request)
        await stream.pump(response)
    except ConnectionError as error:
        log.info("snapshot stream of %s closed early: %r", request[_PREDICTION].id, error)
    return response


@_timed
async def create_prediction(request: web.Request) -> web.StreamResponse:
    body = await _parse_request(request)
    return await _run(request, body.id or f"pred_{time.time_ns():x}", body)


@_timed
async def create_prediction_idempotent(request: web.Request) -> web.StreamResponse:
    prediction_id = request.match_info["id"]
    body = await _parse_request(request)
    if body.id is not None and body.id != prediction_id:
        msg = "prediction ID must match the ID supplied in the URL"
        return _json({"detail": [{"loc": ["body", "id"], "msg": msg, "type": "value_error"}]}, 422)
    return await _run(request, prediction_id, body)


async def cancel_prediction(request: web.Request) -> web.Response:
    require_internal(request, "cancel")
    canceled = request.app[SERVICE].cancel(request.match_info["id"])
    return _json({}, 200 if canceled else 404)


async def root(request: web.Request) -> web.Response:
    return _json(_DISCOVERY)


async def health_check(request: web.Request) -> web.Response:
    return _json(request.app[SERVICE].health())


async def openapi_schema(request: web.Request) -> web.Response:
    body = orjson.dumps(request.app[SERVICE].schema)  # keep the document's own key order
    return web.Response(body=body, content_type=JSON)


async def shutdown(request: web.Request) -> web.Response:
    require_internal(request, "shutdown")
    request.app[SERVICE].shutdown_requested.set()
    return _json({})
