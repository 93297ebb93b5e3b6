"""The runner control API: capabilities, model load/unload, cache flush, health and metrics.

Lifecycle calls (load, unload, flush) change what the runner can serve, so each needs a
``verifiedOpToken`` in its JSON body for exactly that operation and model (see
:mod:`runners.optokens`): 401 without one, 403 with one that fails a check (``code`` says
which), 403 when the runner has no key configured. Inference calls need none.

The token is checked before anything else in the body, so a caller without one learns nothing
(not even which model the runner serves: an unknown model is 404 only to an authorised caller).

Bodies use the names operators' tooling sends: ``modelId``, ``evictModel``, ``taskId``. A flush
answers ``freedBytes`` for the result cache's entries and ``modelCache`` for the model's own
caches (``null`` figures are ones the model cannot measure); 409 ``cache-busy`` when the model
refuses to drop them now (an LLM engine with requests running).
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from runners import protocol as wire
from runners.cache import FlushScope
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
from runners.resources import MIB
from runners.service import RunnerService
from runners.state import SERVICE


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=wire.JSON)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError as error:
        raise InvalidJSONError(str(error)) from error
    if not isinstance(data, dict):
        raise InvalidBodyError(repr(data))
    return data


def _string(data: dict[str, Any], field: str) -> str:
    value = data.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidFieldError(field, f"{field} must be a non-empty string")
    return value


def _optional_string(data: dict[str, Any], field: str) -> str | None:
    return None if data.get(field) is None else _string(data, field)


def _authorise(service: RunnerService, data: dict[str, Any], operation: str, model: str) -> None:
    verifier = service.op_tokens
    if verifier is None:
        raise OpTokensNotConfiguredError()
    token = data.get("verifiedOpToken")
    if not isinstance(token, str) or not token:
        raise OpTokenRequiredError(operation)
    verifier.verify(token, operation, model)


async def capabilities(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if service.starting:
        raise StartingError()
    if service.stopping:
        raise StoppingError()
    return _json(await service.capabilities())


async def load_model(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    data = await _body(request)
    model = _string(data, "modelId")
    evict = _optional_string(data, "evictModel")
    _authorise(service, data, "model-load", model)
    task = service.load(model, evict)
    response = _json(service.lifecycle.describe(task), 202)
    response.headers["Location"] = wire.LOAD_TASK_PATH.format(task_id=task.id)
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
    data = await _body(request)
    model = _string(data, "modelId")
    _authorise(service, data, "model-unload", model)
    outcome = await service.unload(model)
    on_gpu = service.model.device.startswith("cuda")
    return _json(
        {
            "modelId": model,
            "gpuMemoryFreedMB": outcome.unloaded.model_bytes // MIB if on_gpu else 0,
            "kvCacheFlushed": True,  # the model's caches went with it
            "status": "unloaded",
            "freedBytes": outcome.freed_bytes,
            "modelBytes": outcome.unloaded.model_bytes,
            "cacheBytes": outcome.cache.bytes_freed,
            **outcome.unloaded.rss.as_json(),
        }
    )


def _model_cache(flushed: ModelCacheFlush | None) -> dict[str, int | None] | None:
    if flushed is None:
        return None
    return {"freedBytes": flushed.bytes_freed, "freedBlocks": flushed.blocks_freed}


_SCOPE_FIELDS = {
    FlushScope.MODEL: ("modelId", "model"),
    FlushScope.TENANT: ("tenantId", "tenant"),
    FlushScope.TAG: ("tag",),
}
"""Where a flush's scope value is read from: the spec's name first, then Conduit's older one."""


def _scope(data: dict[str, Any]) -> tuple[FlushScope, str | None]:
    raw_scope = data.get("scope", FlushScope.ALL.value)
    if raw_scope not in {scope.value for scope in FlushScope}:
        scopes = ", ".join(scope.value for scope in FlushScope)
        raise InvalidFieldError("scope", f"scope must be one of {scopes}")
    scope = FlushScope(raw_scope)
    if scope is FlushScope.ALL:
        return scope, None
    fields = _SCOPE_FIELDS[scope]
    field = next((name for name in fields if data.get(name) is not None), fields[0])
    return scope, _string(data, field)


async def flush_cache(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    data = await _body(request)
    scope, value = _scope(data)
    model = value if scope is FlushScope.MODEL and value else service.model.name
    _authorise(service, data, "cache-flush", model)
    outcome = await service.flush(scope, value)
    freed = outcome.cache.bytes_freed
    if outcome.model is not None and outcome.model.bytes_freed is not None:
        freed += outcome.model.bytes_freed
    body: dict[str, Any] = {
        "flushed": True,
        "entriesRemoved": outcome.cache.entries,
        "memoryFreedMB": freed // MIB,
        "scope": scope.value,
    }
    if scope is not FlushScope.ALL:
        body[scope.value] = value
    return _json(
        body | {"freedBytes": outcome.cache.bytes_freed, "modelCache": _model_cache(outcome.model)}
    )


async def health(request: web.Request) -> web.Response:
    """The spec's health document; 503 (``unhealthy``) when something is wrong, with why."""
    service = request.app[SERVICE]
    reasons = await service.problems()
    status = wire.RunnerHealth.UNHEALTHY if reasons else wire.RunnerHealth.HEALTHY
    body = {
        "status": status.value,
        "uptime": math.floor(service.uptime),
        "modelsLoaded": 1 if service.ready else 0,
        "queueDepth": service.scheduler.depth,
        "reasons": reasons,
        "model": {"id": service.model.name, "state": service.lifecycle.state.value},
        "queue": {"depth": service.scheduler.depth, "maxDepth": service.config.max_queue_depth},
    }
    return _json(body, 503 if reasons else 200)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[SERVICE].metrics_exposition()
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


def add_control_routes(app: web.Application) -> None:
    app.router.add_get(wire.CAPABILITIES_PATH, capabilities)
    app.router.add_post(wire.LOAD_PATH, load_model)
    app.router.add_get(wire.LOAD_TASK_PATH, load_task)
    app.router.add_post(wire.UNLOAD_PATH, unload_model)
    app.router.add_post(wire.CACHE_FLUSH_PATH, flush_cache)
    app.router.add_get(wire.HEALTH_PATH, health)
    app.router.add_get(wire.METRICS_PATH, metrics)
