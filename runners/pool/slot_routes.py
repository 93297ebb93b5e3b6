"""Each slot of a pool as a Cog-protocol runner under ``/models/<name>/``.

``/``, ``health-check``, ``openapi.json``, ``predictions``, ``predictions/<id>``,
``predictions/<id>/cancel``, and the slot's own ``v1/capabilities`` and ``health``, so a
director's ``--runner-url http://host:port/models/<name>`` works unchanged. A new prediction
first takes a permit from the core (:mod:`runners.pool.host`): at once when the model is ready,
else after its load (and any eviction), or it is refused (:class:`runners.errors.PoolRefusal`,
problem+json naming the code). Then it is proxied to the slot's backend; the permit is held
until the prediction ends, also when it was answered early (``Prefer: respond-async``).

A request's deadline (queue + load + run) is ``X-Conduit-Deadline: <seconds>``, or
``Prefer: wait=<seconds>`` (:mod:`runners.prefer`); ``X-Conduit-Keep-Alive: <seconds>`` asks
for a keep-alive (capped); ``X-Priority`` orders the queue.
"""

from __future__ import annotations

import math
import platform
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from protocol.headers import ACCEPT, ATTACH, IF_MATCH, JSON, LOAD_TIME, POOL_QUEUE_WAIT, PRIORITY
from protocol.paths import (
    CANCEL_PATH,
    CAPABILITIES_PATH,
    DOCS_PATH,
    HEALTH_CHECK_PATH,
    HEALTH_PATH,
    OPENAPI_PATH,
    PREDICTION_PATH,
    PREDICTIONS_PATH,
    ROOT_PATH,
)
from protocol.values import HealthStatus, Priority, RunnerStatus
from runners import COG_VERSION
from runners.auth import require_internal
from runners.errors import (
    CooldownError,
    DeadlineExceededError,
    DeadlineUnmeetableError,
    LoadFailedError,
    ModelTooLargeError,
    NotRunningError,
    PoolRefusal,
    QueueFullError,
    RequestRefused,
    UnknownSlotError,
)
from runners.pool import documents
from runners.pool.backends import Backend
from runners.pool.events import Grant, Refuse, RejectCode
from runners.pool.host import Ask
from runners.pool.proxy import proxy
from runners.pool.slots import SlotState, SlotView
from runners.pool.state import POOL, Pool
from runners.prefer import deadline, seconds
from runners.streaming import wants_stream

KEEP_ALIVE = "X-Conduit-Keep-Alive"
SLOT = "/models/{model}"
PROBES = frozenset({SLOT + HEALTH_CHECK_PATH, SLOT + HEALTH_PATH})
"""A slot's health checks: like a single runner's, they need no token."""

_REFUSALS: dict[RejectCode, type[PoolRefusal]] = {
    RejectCode.COOLDOWN: CooldownError,
    RejectCode.LOAD_FAILED: LoadFailedError,
    RejectCode.MODEL_TOO_LARGE: ModelTooLargeError,
    RejectCode.DEADLINE_UNMEETABLE: DeadlineUnmeetableError,
    RejectCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    RejectCode.UNKNOWN_MODEL: UnknownSlotError,
}


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON)


def _ask(request: web.Request) -> Ask:
    headers = request.headers
    return Ask(
        deadline_in=deadline(headers),
        priority=Priority.parse(headers.get(PRIORITY)).weight,
        keep_alive=seconds(headers.get(KEEP_ALIVE), KEEP_ALIVE, negative=True),
    )


def refusal(pool: Pool, name: str, refused: Refuse) -> RequestRefused:
    """The refusal that answers the core's ``Refuse`` of a request for ``name``."""
    if refused.code is RejectCode.QUEUE_FULL:
        depth, max_depth = pool.core.queued(), pool.file.max_queue_depth
        return QueueFullError(depth, max_depth, 0.0, max(1, math.ceil(refused.retry_after or 1)))
    why = ""
    if refused.code in (RejectCode.LOAD_FAILED, RejectCode.COOLDOWN):
        why = pool.host.load_errors.get(name, "")
    return _REFUSALS[refused.code](name, refused.retry_after, why)


def _with_id(raw: bytes) -> tuple[bytes, str | None]:
    """A POST body with an ``id`` (one is made up when it has none), so its run can be
    followed; a body that is not a JSON object goes as it is (the backend refuses it)."""
    try:
        data = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        return raw, None
    if not isinstance(data, dict):
        return raw, None
    if not isinstance(data.get("id"), str) or not data["id"]:
        data["id"] = f"pred_{time.time_ns():x}"
    return orjson.dumps(data), data["id"]


async def predict(request: web.Request) -> web.StreamResponse:
    pool = request.app[POOL]
    name = request.match_info["model"]
    backend = pool.backend(name)
    prediction_id: str | None = request.match_info.get("id")
    raw = await request.read()
    if prediction_id is None:
        raw, prediction_id = _with_id(raw)
    path = (
        PREDICTIONS_PATH if request.method == "POST" else PREDICTION_PATH.format(id=prediction_id)
    )
    running = pool.running.setdefault(name, set())
    attach = request.headers.get(IF_MATCH, "").strip() == ATTACH
    if attach or (prediction_id is not None and prediction_id in running):
        # Already granted: an attach or a repeated PUT holds no permit of its own.
        if attach or wants_stream(request.headers.get(ACCEPT)):
            require_internal(request, "attach" if attach else "taking over a prediction")
        if prediction_id not in running or backend.url is None:
            raise NotRunningError(prediction_id or "")
        return await proxy(request, pool.session, backend, path, raw)
    outcome = await pool.host.acquire(name, _ask(request))
    if isinstance(outcome, Refuse):
        raise refusal(pool, name, outcome)
    key = prediction_id or uuid.uuid4().hex
    running.add(key)
    try:
        return await proxy(request, pool.session, backend, path, raw, _waited(outcome))
    finally:
        pool.spawn(_settle(pool, backend, running, key, outcome))


def _waited(grant: Grant) -> dict[str, str]:
    """The start's time in the pool, as headers a director adds to the run's metrics: the cold
    start it sat through (``X-Conduit-Load-Time``) and its queueing beyond that."""
    times = {
        LOAD_TIME: grant.load_s,
        POOL_QUEUE_WAIT: max(0.0, grant.waited_s - grant.load_s),
    }
    return {name: f"{seconds:.6f}" for name, seconds in times.items() if seconds > 0}


async def _settle(pool: Pool, backend: Backend, running: set[str], key: str, grant: Grant) -> None:
    try:
        await backend.settled(key)
    finally:
        running.discard(key)
        pool.host.release(grant)


async def cancel(request: web.Request) -> web.StreamResponse:
    require_internal(request, "cancel")
    pool, name = request.app[POOL], request.match_info["model"]
    backend = pool.backend(name)
    if request.match_info["id"] not in pool.running.get(name, ()) or backend.url is None:
        return web.json_response({}, status=404)
    path = CANCEL_PATH.format(id=request.match_info["id"])
    return await proxy(request, pool.session, backend, path)


def _health_status(view: SlotView, concurrency: int) -> HealthStatus:
    match view.state:
        case SlotState.LOADING:
            return HealthStatus.STARTING
        case SlotState.FAILED:
            return HealthStatus.SETUP_FAILED
        case SlotState.READY if view.in_flight >= concurrency:
            return HealthStatus.BUSY
    return HealthStatus.READY  # idle and stopping slots load on demand


async def slot_health(request: web.Request) -> web.Response:
    """coglet's document for the slot. ``setup.started_at`` is the pool's: a slot's reloads are
    not restarts (nothing runs across them), and a director would count them as such."""
    pool, name = request.app[POOL], request.match_info["model"]
    pool.backend(name)
    view = pool.view(name)
    spec = next(m for m in pool.file.models if m.name == name)
    status = _health_status(view, spec.concurrency)
    setup = {
        "status": RunnerStatus.FAILED
        if status is HealthStatus.SETUP_FAILED
        else RunnerStatus.SUCCEEDED,
        "started_at": pool.started_at,
        "logs": pool.host.load_errors.get(name, "") if view.state is SlotState.FAILED else "",
    }
    version = {"coglet": COG_VERSION, "python": platform.python_version()}
    return _json({"status": status.value, "setup": setup, "version": version})


async def slot_health_document(request: web.Request) -> web.Response:
    """The spec's ``GET /health`` for one slot (:func:`runners.pool.documents.slot_health`)."""
    pool, name = request.app[POOL], request.match_info["model"]
    pool.backend(name)
    document = documents.slot_health(pool, name)
    return _json(document.wire(), 503 if document.reasons else 200)


def _discovery(prefix: str) -> dict[str, Any]:
    return {
        "cog_version": COG_VERSION,
        "docs_url": prefix + DOCS_PATH,
        "healthcheck_url": prefix + HEALTH_CHECK_PATH,
        "openapi_url": prefix + OPENAPI_PATH,
        "predictions_cancel_url": prefix + CANCEL_PATH.format(id="{prediction_id}"),
        "predictions_idempotent_url": prefix + PREDICTION_PATH.format(id="{prediction_id}"),
        "predictions_url": prefix + PREDICTIONS_PATH,
    }


async def slot_root(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    request.app[POOL].backend(name)
    return _json(_discovery(f"/models/{name}"))


async def slot_openapi(request: web.Request) -> web.Response:
    """The model's schema; a Cog server's is read at its first load (loaded now if need be)."""
    pool, name = request.app[POOL], request.match_info["model"]
    backend = pool.backend(name)
    if (schema := backend.openapi()) is None:
        outcome = await pool.host.acquire(name, Ask())
        if isinstance(outcome, Refuse):
            raise refusal(pool, name, outcome)
        pool.host.release(outcome)
        schema = backend.openapi() or {}
    return web.Response(body=orjson.dumps(schema), content_type=JSON)


async def slot_capabilities(request: web.Request) -> web.Response:
    pool, name = request.app[POOL], request.match_info["model"]
    pool.backend(name)
    return _json(documents.capabilities(pool, name))


def add_slot_routes(app: web.Application) -> None:
    r = app.router
    r.add_get(SLOT, slot_root)
    r.add_get(SLOT + ROOT_PATH, slot_root)
    r.add_get(SLOT + HEALTH_CHECK_PATH, slot_health)
    r.add_get(SLOT + OPENAPI_PATH, slot_openapi)
    r.add_get(SLOT + CAPABILITIES_PATH, slot_capabilities)
    r.add_get(SLOT + HEALTH_PATH, slot_health_document)
    r.add_post(SLOT + PREDICTIONS_PATH, predict)
    r.add_put(SLOT + PREDICTION_PATH, predict)
    r.add_post(SLOT + CANCEL_PATH, cancel)
