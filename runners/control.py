"""The runner control API: capabilities, model load/unload, cache flush, health and metrics.

Every route here but ``GET /health`` sits behind the runner token when the runner has one
(:mod:`runners.auth`). Lifecycle calls (load, unload, flush) change what the runner can serve,
so each also needs a ``verifiedOpToken`` in its JSON body for exactly that operation, model and
(when the token names one) runner (see :mod:`runners.optokens`): 401 without one, 403 with one
that fails a check (``code`` says which), 403 when the runner has no key configured, 503 when
its nonce store does not answer. Inference calls need none.

A body is read as its document of :mod:`runners.protocol.lifecycle` (a malformed one is 400 or
422 ``invalid-field``), then the token is checked before the runner acts on anything in it, so
a caller without one learns nothing (not even which model the runner serves: an unknown model
is 404 only to an authorised caller). Answers are the spec's documents, with Conduit's figures
beside the spec's; 409 ``cache-busy`` when the model refuses to drop its caches now (an LLM
engine with requests running).
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import orjson
import pydantic
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from runners import protocol as wire
from runners.errors import (
    InvalidBodyError,
    InvalidFieldError,
    InvalidJSONError,
    OpTokenRequiredError,
    OpTokensNotConfiguredError,
    StartingError,
    StoppingError,
    UnknownTaskError,
)
from runners.model import ModelCacheFlush
from runners.protocol.lifecycle import (
    FlushRequest,
    FlushResult,
    HealthDocument,
    LifecycleRequest,
    LoadRequest,
    ModelCacheFreed,
    ModelStatus,
    UnloadRequest,
    UnloadResult,
)
from runners.resources import MIB
from runners.service import FlushOutcome, RunnerService
from runners.state import SERVICE

_Body = TypeVar("_Body", LoadRequest, UnloadRequest, FlushRequest)


def _json(body: wire._Document | dict[str, Any], status: int = 200) -> web.Response:
    payload = body.wire() if isinstance(body, wire._Document) else body
    return web.Response(body=orjson.dumps(payload), status=status, content_type=wire.JSON)


async def _body(request: web.Request, document: type[_Body]) -> _Body:
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
    service: RunnerService, body: LifecycleRequest, operation: wire.Operation, model: str
) -> None:
    verifier = service.op_tokens
    if verifier is None:
        raise OpTokensNotConfiguredError()
    token = body.verified_op_token
    if not token:
        raise OpTokenRequiredError(operation)
    await verifier.verify(token, operation, model)


async def capabilities(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if service.starting:
        raise StartingError()
    if service.stopping:
        raise StoppingError()
    return _json(await service.capabilities())


async def load_model(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    body = await _body(request, LoadRequest)
    await _authorise(service, body, wire.Operation.MODEL_LOAD, body.model_id)
    task = service.load(body.model_id, body.evict_model)
    response = _json(service.lifecycle.describe(task), 202)
    response.headers[wire.LOCATION] = wire.LOAD_TASK_PATH.format(task_id=task.id)
    return response


async def load_task(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    task_id = request.match_info["task_id"]
    task = service.lifecycle.tasks.get(task_id)
    if task is None:
        raise UnknownTaskError(task_id)
    return _json(service.lifecycle.describe(task))


async def unload_model(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    body = await _body(request, UnloadRequest)
    await _authorise(service, body, wire.Operation.MODEL_UNLOAD, body.model_id)
    outcome = await service.unload(body.model_id)
    on_gpu = service.model.device.startswith("cuda")
    rss = outcome.unloaded.rss
    result = UnloadResult(
        model_id=body.model_id,
        gpu_memory_freed_mb=outcome.unloaded.model_bytes // MIB if on_gpu else 0,
        kv_cache_flushed=True,  # the model's caches went with it
        freed_bytes=outcome.freed_bytes,
        model_bytes=outcome.unloaded.model_bytes,
        cache_bytes=outcome.cache.bytes_freed,
        rss_before_bytes=rss.before,
        rss_after_bytes=rss.after,
        rss_delta_bytes=rss.delta,
    )
    return _json(result)


def _model_cache(flushed: ModelCacheFlush | None) -> ModelCacheFreed | None:
    if flushed is None:
        return None
    return ModelCacheFreed(freed_bytes=flushed.bytes_freed, freed_blocks=flushed.blocks_freed)


def _memory_freed_mb(outcome: FlushOutcome) -> int | None:
    """MiB released: the result-cache entries plus the model's caches, None when the model
    flushed caches it cannot measure (a sum with an unknown part is not a measurement)."""
    freed = outcome.cache.bytes_freed
    if outcome.model is not None:
        if outcome.model.bytes_freed is None:
            return None
        freed += outcome.model.bytes_freed
    return freed // MIB


async def flush_cache(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    body = await _body(request, FlushRequest)
    scope, value = body.scope, body.value
    if scope is not wire.FlushScope.ALL and value is None:
        field = body.value_field
        raise InvalidFieldError(field, f"{field} must be a non-empty string")
    model = value if scope is wire.FlushScope.MODEL and value else service.model.name
    await _authorise(service, body, wire.Operation.CACHE_FLUSH, model)
    outcome = await service.flush(scope, value)
    echoed: dict[str, Any] = {} if value is None else {scope.value: value}
    result = FlushResult(
        flushed=True,
        entries_removed=outcome.cache.entries,
        memory_freed_mb=_memory_freed_mb(outcome),
        scope=scope,
        freed_bytes=outcome.cache.bytes_freed,
        model_cache=_model_cache(outcome.model),
        **echoed,
    )
    return _json(result)


async def health(request: web.Request) -> web.Response:
    """The spec's health document; 503 (``unhealthy``) when something is wrong, with why."""
    service = request.app[SERVICE]
    reasons = await service.problems()
    status = wire.RunnerHealth.UNHEALTHY if reasons else wire.RunnerHealth.HEALTHY
    document = HealthDocument(
        status=status,
        uptime=math.floor(service.uptime),
        models_loaded=1 if service.ready else 0,
        queue_depth=service.scheduler.depth,
        reasons=reasons,
        model=ModelStatus(id=service.model.name, state=service.lifecycle.state.value),
        queue=wire.QueueBounds(
            depth=service.scheduler.depth, max_depth=service.config.max_queue_depth
        ),
    )
    return _json(document, 503 if reasons else 200)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[SERVICE].metrics_exposition()
    response = web.Response(body=body)
    response.headers[wire.CONTENT_TYPE] = CONTENT_TYPE_LATEST
    return response


def add_control_routes(app: web.Application) -> None:
    app.router.add_get(wire.CAPABILITIES_PATH, capabilities)
    app.router.add_post(wire.LOAD_PATH, load_model)
    app.router.add_get(wire.LOAD_TASK_PATH, load_task)
    app.router.add_post(wire.UNLOAD_PATH, unload_model)
    app.router.add_post(wire.CACHE_FLUSH_PATH, flush_cache)
    app.router.add_get(wire.HEALTH_PATH, health)
    app.router.add_get(wire.METRICS_PATH, metrics)
