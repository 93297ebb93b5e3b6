"""The runner control API: capabilities, model load/unload, cache flush, health and metrics, for
any host behind :class:`runners.control_plane.ControlPlane` (a single runner, a model pool).

Every route here but ``GET /health`` sits behind the runner token when the host has one
(:mod:`runners.auth`). Lifecycle calls (load, unload, flush) change what the host can serve,
so each also needs a ``verifiedOpToken`` in its JSON body for exactly that operation, model and
(when the token names one) runner (see :mod:`runners.optokens`): 401 without one, 403 with one
that fails a check (``code`` says which), 403 when the host has no key configured, 503 when
its nonce store does not answer. Inference calls need none.

A body is read as its document of :mod:`protocol.lifecycle` (a malformed one is 400 or
422 ``invalid-field``), then the token is checked before the plane acts on anything in it, so
a caller without one learns nothing (not even which models the host serves: an unknown model
is 404 only to an authorised caller). Answers are the spec's documents, with Conduit's figures
beside the spec's; 409 ``cache-busy`` when the model refuses to drop its caches now (an LLM
engine with requests running).

:func:`control_app` is the frame both hosts are built on: refusals rendered
(:mod:`runners.problems`), the runner token checked, encoded bodies refused
(:mod:`runners.encoding`), and these routes, served by whatever ``app[CONTROL_PLANE]`` holds
once the app has started.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, TypeVar

import orjson
import pydantic
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from protocol.headers import CONTENT_TYPE, JSON, LOCATION
from protocol.lifecycle import FlushRequest, LifecycleRequest, LoadRequest, UnloadRequest
from protocol.paths import (
    CACHE_FLUSH_PATH,
    CAPABILITIES_PATH,
    HEALTH_PATH,
    LOAD_PATH,
    LOAD_TASK_PATH,
    METRICS_PATH,
    PROBE_PATHS,
    UNLOAD_PATH,
)
from protocol.values import FlushScope, Operation
from runners.auth import protect
from runners.config import RunnerConfig
from runners.control_errors import (
    InvalidBodyError,
    InvalidFieldError,
    InvalidJSONError,
    OpTokenRequiredError,
    OpTokensNotConfiguredError,
)
from runners.control_plane import ControlPlane
from runners.encoding import refuse_encoded_bodies
from runners.problems import refusals

__all__ = ["CONTROL_PLANE", "MAX_BODY_BYTES", "add_control_routes", "control_app", "read_body"]

MAX_BODY_BYTES = 100 * 1024 * 1024

CONTROL_PLANE = web.AppKey("control_plane", ControlPlane)
"""What the control routes act on: set by whoever builds the app, before it serves."""

_Body = TypeVar("_Body", LoadRequest, UnloadRequest, FlushRequest)


def _json(payload: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type=JSON)


async def read_body(request: web.Request, document: type[_Body]) -> _Body:
    """The request's JSON body as ``document``; an empty body is ``{}``."""
    try:
        data = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError as error:
        raise InvalidJSONError(str(error)) from error
    if not isinstance(data, dict):
        raise InvalidBodyError(repr(data))
    try:
        return document.model_validate(data)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "body"
        raise InvalidFieldError(field, f"{field}: {first['msg']}") from error


async def _authorise(
    plane: ControlPlane, body: LifecycleRequest, operation: Operation, model: str
) -> None:
    verifier = plane.op_tokens
    if verifier is None:
        raise OpTokensNotConfiguredError()
    token = body.verified_op_token
    if not token:
        raise OpTokenRequiredError(operation)
    await verifier.verify(token, operation, model)


async def capabilities(request: web.Request) -> web.Response:
    return _json(await request.app[CONTROL_PLANE].capabilities())


async def load_model(request: web.Request) -> web.Response:
    plane = request.app[CONTROL_PLANE]
    body = await read_body(request, LoadRequest)
    await _authorise(plane, body, Operation.MODEL_LOAD, body.model_id)
    task = plane.load(body.model_id, body.evict_model)
    response = _json(task.wire(), 202)
    response.headers[LOCATION] = LOAD_TASK_PATH.format(task_id=task.task_id)
    return response


async def load_task(request: web.Request) -> web.Response:
    return _json(request.app[CONTROL_PLANE].load_task(request.match_info["task_id"]).wire())


async def unload_model(request: web.Request) -> web.Response:
    plane = request.app[CONTROL_PLANE]
    body = await read_body(request, UnloadRequest)
    await _authorise(plane, body, Operation.MODEL_UNLOAD, body.model_id)
    return _json((await plane.unload(body.model_id)).wire())


async def flush_cache(request: web.Request) -> web.Response:
    plane = request.app[CONTROL_PLANE]
    body = await read_body(request, FlushRequest)
    scope, value = body.scope, body.value
    if scope is not FlushScope.ALL and value is None:
        field = body.value_field
        raise InvalidFieldError(field, f"{field} must be a non-empty string")
    model = value if scope is FlushScope.MODEL and value else plane.name
    await _authorise(plane, body, Operation.CACHE_FLUSH, model)
    return _json((await plane.flush(scope, value)).wire())


async def health(request: web.Request) -> web.Response:
    """The spec's health document; 503 (``unhealthy``) when something is wrong, with why."""
    document = await request.app[CONTROL_PLANE].health()
    return _json(document.wire(), 503 if document.reasons else 200)


async def metrics(request: web.Request) -> web.Response:
    response = web.Response(body=request.app[CONTROL_PLANE].metrics())
    response.headers[CONTENT_TYPE] = CONTENT_TYPE_LATEST
    return response


def add_control_routes(app: web.Application) -> None:
    app.router.add_get(CAPABILITIES_PATH, capabilities)
    app.router.add_post(LOAD_PATH, load_model)
    app.router.add_get(LOAD_TASK_PATH, load_task)
    app.router.add_post(UNLOAD_PATH, unload_model)
    app.router.add_post(CACHE_FLUSH_PATH, flush_cache)
    app.router.add_get(HEALTH_PATH, health)
    app.router.add_get(METRICS_PATH, metrics)


def control_app(config: RunnerConfig, probes: Collection[str] = PROBE_PATHS) -> web.Application:
    """A host's app with the control API mounted: refusals answered as
    :mod:`runners.errors` says, the runner token (``config.token``, or loopback trust) checked
    on every route but ``probes`` (:mod:`runners.auth`), bodies with a ``Content-Encoding``
    refused unread. Set ``app[CONTROL_PLANE]`` before it serves."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[refusals])
    protect(app, config.token, config.trust_loopback, probes)
    app.middlewares.append(refuse_encoded_bodies)
    add_control_routes(app)
    return app
