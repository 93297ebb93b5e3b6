"""``conduit runner pool``: the pool's HTTP shell.

Each slot is a Cog-protocol runner under ``/models/<name>/`` (``/``, ``health-check``,
``openapi.json``, ``predictions``, ``predictions/<id>``, ``predictions/<id>/cancel``, and its
own ``v1/capabilities`` and ``health``), so a director's ``--runner-url http://host:port/models/<name>``
works unchanged. A new prediction first takes a permit from the core (:mod:`runners.pool.host`):
at once when the model is ready, else after its load (and any eviction), or it is refused --
``503`` + ``Retry-After`` (``queue_full``, ``cooldown``, ``load_failed``), ``422``
(``model_too_large``, ``deadline_unmeetable``), ``504`` (``deadline_exceeded``), all
problem+json naming the code. Then it is proxied to the slot's backend; the permit is held until
the prediction ends, also when it was answered early (``Prefer: respond-async``).

A request's deadline (queue + load + run) is ``X-Conduit-Deadline: <seconds>``
(``runners.protocol.DEADLINE``, which a director sends on each start) or
``Prefer: wait=<seconds>``; ``X-Conduit-Keep-Alive: <seconds>`` asks for a keep-alive (capped);
``X-Priority`` orders the queue.

The control API at the root covers every slot: ``/v1/capabilities`` (a ``slots`` list beside
the spec's inventory), ``/v1/models/load`` (with ``evictModel``), ``/v1/models/unload``,
``/v1/cache/flush``, ``/health``, ``/metrics``, with :mod:`runners.control`'s bodies and
operation tokens. The runner token (``CONDUIT_RUNNER_TOKEN``) guards every route but the
health checks, as on a single runner (:mod:`runners.auth`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import platform
import signal
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from runners import COG_VERSION
from runners import protocol as wire
from runners.auth import LOOPBACK_TRUSTED, TOKEN_REQUIRED, is_loopback_host, require_internal
from runners.config import RunnerConfig
from runners.control import _body
from runners.encoding import refuse_encoded_bodies
from runners.errors import (
    InvalidFieldError,
    LifecycleConflictError,
    NotRunningError,
    OpTokenRequiredError,
    OpTokensNotConfiguredError,
    QueueFullError,
    RequestRefused,
    UnauthorizedError,
    UnknownTaskError,
)
from runners.optokens import NonceStore, OpTokenVerifier, RedisNonceStore
from runners.pool.backends import Backend, ConduitBackend, build
from runners.pool.config import FixedProbe, MemoryProbe, PoolConfigError
from runners.pool.config_file import PoolFile, load
from runners.pool.core import PoolCore, SlotView
from runners.pool.events import Grant, Reject, RejectCode
from runners.pool.host import Ask, PoolHost
from runners.pool.nvml import SystemProbe
from runners.pool.slots import SlotState
from runners.problems import refusals
from runners.protocol.lifecycle import (
    FlushRequest,
    FlushResult,
    HealthDocument,
    LifecycleRequest,
    LoadRequest,
    LoadStatus,
    LoadTask,
    ModelStatus,
    UnloadRequest,
    UnloadResult,
)
from runners.resources import MIB, process_rss
from runners.streaming import wants_stream

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 100 * 1024 * 1024
KEEP_ALIVE = "X-Conduit-Keep-Alive"
_PRIORITIES = {wire.Priority.LOW: -1, wire.Priority.NORMAL: 0, wire.Priority.HIGH: 1}
_HOP_BY_HOP = frozenset(
    {
        "authorization",
        "connection",
        "content-length",
        "host",
        "keep-alive",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- refusals ---------------------------------------------------------------------------------


class PoolRefusal(RequestRefused):
    """A request the pool's core refused; ``code`` is the core's :class:`RejectCode`."""

    title = "The model pool cannot serve this now"

    def __init__(self, model: str, retry_after: float | None, why: str = "") -> None:
        super().__init__(f"model {model}: {self.code}{f' ({why})' if why else ''}")
        self.model = model
        if retry_after is not None:
            self.retry_after = max(1, math.ceil(retry_after))

    def members(self) -> dict[str, Any]:
        return {"field": "model", "model": self.model}


class CooldownError(PoolRefusal):
    status, code = 503, RejectCode.COOLDOWN.value


class LoadFailedError(PoolRefusal):
    status, code = 503, RejectCode.LOAD_FAILED.value


class ModelTooLargeError(PoolRefusal):
    status, code = 422, RejectCode.MODEL_TOO_LARGE.value


class DeadlineUnmeetableError(PoolRefusal):
    status, code = 422, wire.DeadlineCode.UNMEETABLE.value


class DeadlineExceededError(PoolRefusal):
    status, code = 504, wire.DeadlineCode.EXCEEDED.value


class UnknownSlotError(PoolRefusal):
    status, code = 404, RejectCode.UNKNOWN_MODEL.value


class BackendUnreachableError(RequestRefused):
    status, code, title = 502, "backend-unreachable", "The model's server did not answer"


_REFUSALS: dict[RejectCode, type[PoolRefusal]] = {
    RejectCode.COOLDOWN: CooldownError,
    RejectCode.LOAD_FAILED: LoadFailedError,
    RejectCode.MODEL_TOO_LARGE: ModelTooLargeError,
    RejectCode.DEADLINE_UNMEETABLE: DeadlineUnmeetableError,
    RejectCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    RejectCode.UNKNOWN_MODEL: UnknownSlotError,
}


# --- state ------------------------------------------------------------------------------------


@dataclass
class _LoadOp:
    task_id: str
    model_id: str
    evict: str | None
    created_at: str
    status: LoadStatus = LoadStatus.LOADING
    error: str | None = None
    completed_at: str | None = None

    def document(self) -> LoadTask:
        return LoadTask(
            task_id=self.task_id,
            model_id=self.model_id,
            status=self.status,
            progress=1.0 if self.status is LoadStatus.COMPLETED else 0.0,
            eta=0 if self.status is not LoadStatus.LOADING else None,
            error=self.error,
            created_at=self.created_at,
            completed_at=self.completed_at,
            evict_model=self.evict,
        )


@dataclass
class Pool:
    file: PoolFile
    host: PoolHost
    session: aiohttp.ClientSession
    runner_id: str
    op_tokens: OpTokenVerifier | None
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    began: float = field(default_factory=time.monotonic)
    running: dict[str, set[str]] = field(default_factory=dict)
    """Prediction ids each slot runs (granted, not yet settled)."""
    loads: dict[str, _LoadOp] = field(default_factory=dict)
    shutdown: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def core(self) -> PoolCore:
        return self.host.core

    def backend(self, name: str) -> Backend:
        backend = self.host.backends.get(name)
        if backend is None:
            raise UnknownSlotError(name, None)
        return backend

    def view(self, name: str) -> SlotView:
        return next(v for v in self.core.slots() if v.model == name)

    def spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


POOL = web.AppKey("pool", Pool)
PROBE = web.AppKey("probe", MemoryProbe)


# --- auth -------------------------------------------------------------------------------------


def _authenticate(token: str | None) -> Callable[..., Awaitable[web.StreamResponse]]:
    """:mod:`runners.auth`'s rule with the slots' health checks counted as probes."""
    import hmac

    expected = None if token is None else token.encode()

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None and not _is_probe(request):
            scheme, _, given = request.headers.get(wire.AUTHORIZATION, "").strip().partition(" ")
            credentials = given.strip().encode("utf-8", "surrogateescape")
            if scheme.lower() != "bearer" or not hmac.compare_digest(credentials, expected):
                raise UnauthorizedError()
        return await handler(request)

    return authenticate


def _is_probe(request: web.Request) -> bool:
    if request.method not in ("GET", "HEAD"):
        return False
    path = request.path
    return path in wire.PROBE_PATHS or (
        path.startswith("/models/") and path.endswith((wire.HEALTH_CHECK_PATH, wire.HEALTH_PATH))
    )


# --- proxying ---------------------------------------------------------------------------------


async def _proxy(
    request: web.Request,
    backend: Backend,
    path: str,
    body: bytes | None = None,
    extra: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Forward the request to the backend and its answer back, streaming an NDJSON one, with
    the ``extra`` headers added to the answer."""
    url = backend.url
    if url is None:
        raise BackendUnreachableError("the model is not running")
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
    headers.update(backend.headers)
    pool = request.app[POOL]
    try:
        upstream = await pool.session.request(
            request.method,
            url + path,
            params=request.query,
            data=body if body is not None else await request.read(),
            headers=headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=5),
        )
    except (aiohttp.ClientError, TimeoutError) as error:
        raise BackendUnreachableError(f"the model's server did not answer: {error!r}") from None
    try:
        answer = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
        answer.update(extra or {})
        if upstream.content_type != wire.NDJSON:
            data = await upstream.read()
            return web.Response(body=data, status=upstream.status, headers=answer)
        response = web.StreamResponse(status=upstream.status, headers=answer)
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientError) as error:
            log.info("snapshot stream of %s closed early: %r", request.path, error)
        return response
    finally:
        upstream.release()


# --- the slots' Cog routes --------------------------------------------------------------------


def _ask(request: web.Request) -> Ask:
    headers = request.headers
    deadline = _seconds(headers.get(wire.DEADLINE), wire.DEADLINE)
    if deadline is None:
        for part in headers.get(wire.PREFER, "").split(","):
            key, _, value = part.strip().partition("=")
            if key.strip().lower() == "wait":
                deadline = _seconds(value, wire.PREFER)
    return Ask(
        deadline_in=deadline,
        priority=_PRIORITIES[wire.Priority.parse(headers.get(wire.PRIORITY))],
        keep_alive=_seconds(headers.get(KEEP_ALIVE), KEEP_ALIVE, negative=True),
    )


def _seconds(value: str | None, name: str, negative: bool = False) -> float | None:
    if value is None or not value.strip():
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or (seconds < 0 and not negative):
        raise InvalidFieldError(name, f"{name} must be a number of seconds")
    return seconds


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
        wire.PREDICTIONS_PATH
        if request.method == "POST"
        else wire.PREDICTION_PATH.format(id=prediction_id)
    )
    running = pool.running.setdefault(name, set())
    attach = request.headers.get(wire.IF_MATCH, "").strip() == wire.ATTACH
    if attach or (prediction_id is not None and prediction_id in running):
        # Already granted: an attach or a repeated PUT holds no permit of its own.
        if attach or wants_stream(request.headers.get(wire.ACCEPT)):
            require_internal(request, "attach" if attach else "taking over a prediction")
        if prediction_id not in running or backend.url is None:
            raise NotRunningError(prediction_id or "")
        return await _proxy(request, backend, path, raw)
    outcome = await pool.host.acquire(name, _ask(request))
    if isinstance(outcome, Reject):
        raise _refusal(pool, name, outcome)
    key = prediction_id or uuid.uuid4().hex
    running.add(key)
    try:
        return await _proxy(request, backend, path, raw, _waited(outcome))
    finally:
        pool.spawn(_settle(pool, backend, running, key, outcome))


def _waited(grant: Grant) -> dict[str, str]:
    """The start's time in the pool, as headers a director adds to the run's metrics: the cold
    start it sat through (``X-Conduit-Load-Time``) and its queueing beyond that."""
    times = {
        wire.LOAD_TIME: grant.load_s,
        wire.POOL_QUEUE_WAIT: max(0.0, grant.waited_s - grant.load_s),
    }
    return {name: f"{seconds:.6f}" for name, seconds in times.items() if seconds > 0}


async def _settle(pool: Pool, backend: Backend, running: set[str], key: str, grant: Grant) -> None:
    try:
        await backend.settled(key)
    finally:
        running.discard(key)
        pool.host.release(grant)


def _refusal(pool: Pool, name: str, reject: Reject) -> RequestRefused:
    if reject.code is RejectCode.QUEUE_FULL:
        depth, max_depth = pool.core.queued(), pool.file.max_queue_depth
        return QueueFullError(depth, max_depth, 0.0, max(1, math.ceil(reject.retry_after or 1)))
    why = ""
    if reject.code in (RejectCode.LOAD_FAILED, RejectCode.COOLDOWN):
        why = pool.host.load_errors.get(name, "")
    return _REFUSALS[reject.code](name, reject.retry_after, why)


async def cancel(request: web.Request) -> web.StreamResponse:
    require_internal(request, "cancel")
    pool, name = request.app[POOL], request.match_info["model"]
    backend = pool.backend(name)
    if request.match_info["id"] not in pool.running.get(name, ()) or backend.url is None:
        return web.json_response({}, status=404)
    return await _proxy(request, backend, wire.CANCEL_PATH.format(id=request.match_info["id"]))


def _health_status(view: SlotView, concurrency: int) -> wire.HealthStatus:
    match view.state:
        case SlotState.LOADING:
            return wire.HealthStatus.STARTING
        case SlotState.FAILED:
            return wire.HealthStatus.SETUP_FAILED
        case SlotState.READY if view.in_flight >= concurrency:
            return wire.HealthStatus.BUSY
    return wire.HealthStatus.READY  # idle and stopping slots load on demand


async def slot_health(request: web.Request) -> web.Response:
    """coglet's document for the slot. ``setup.started_at`` is the pool's: a slot's reloads are
    not restarts (nothing runs across them), and a director would count them as such."""
    pool, name = request.app[POOL], request.match_info["model"]
    pool.backend(name)
    view = pool.view(name)
    spec = next(m for m in pool.file.models if m.name == name)
    status = _health_status(view, spec.concurrency)
    setup = {
        "status": wire.RunnerStatus.FAILED
        if status is wire.HealthStatus.SETUP_FAILED
        else wire.RunnerStatus.SUCCEEDED,
        "started_at": pool.started_at,
        "logs": pool.host.load_errors.get(name, "") if view.state is SlotState.FAILED else "",
    }
    version = {"coglet": COG_VERSION, "python": platform.python_version()}
    return _json({"status": status.value, "setup": setup, "version": version})


def _discovery(prefix: str) -> dict[str, Any]:
    return {
        "cog_version": COG_VERSION,
        "docs_url": prefix + wire.DOCS_PATH,
        "healthcheck_url": prefix + wire.HEALTH_CHECK_PATH,
        "openapi_url": prefix + wire.OPENAPI_PATH,
        "predictions_cancel_url": prefix + wire.CANCEL_PATH.format(id="{prediction_id}"),
        "predictions_idempotent_url": prefix + wire.PREDICTION_PATH.format(id="{prediction_id}"),
        "predictions_url": prefix + wire.PREDICTIONS_PATH,
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
        if isinstance(outcome, Reject):
            raise _refusal(pool, name, outcome)
        pool.host.release(outcome)
        schema = backend.openapi() or {}
    return web.Response(body=orjson.dumps(schema), content_type=wire.JSON)


# --- the control API --------------------------------------------------------------------------


def _json(body: wire._Document | dict[str, Any], status: int = 200) -> web.Response:
    payload = body.wire() if isinstance(body, wire._Document) else body
    return web.Response(body=orjson.dumps(payload), status=status, content_type=wire.JSON)


def _slot_document(pool: Pool, view: SlotView) -> dict[str, Any]:
    backend, now = pool.host.backends[view.model], pool.host.now()
    wall = time.time() - now  # the loop clock's instants as epoch seconds

    def epoch(at: float | None) -> float | None:
        return None if at is None or at == 0.0 else round(wall + at, 3)

    return {
        "model": view.model,
        "state": view.state.value,
        "pinned": view.pinned,
        "device": backend.device,
        "devices": list(view.devices),
        "leaseBytes": view.lease_bytes,
        "observedBytes": view.observed_bytes,
        "inFlight": view.in_flight,
        "lastUsed": epoch(view.last_used),
        "expiresAt": epoch(view.expires_at),
        "loadEwmaSeconds": round(view.load_ewma, 6),
        "lastTransition": {
            "state": view.last_state.value,
            "reason": view.last_reason,
            "at": epoch(view.last_at),
        },
        "cooldownUntil": epoch(view.cooldown_until),
        "lastUnload": None
        if (unload := pool.host.last_unload.get(view.model)) is None
        else {"reason": unload[0], "at": epoch(unload[1])},
        "url": f"/models/{view.model}",
    }


def _capabilities(pool: Pool, only: str | None = None) -> dict[str, Any]:
    views = [v for v in pool.core.slots() if only is None or v.model == only]
    loaded = [
        wire.LoadedModel(
            id=v.model,
            memoryBytes=v.observed_bytes,
            device=pool.host.backends[v.model].device,
        )
        for v in views
        if v.state is SlotState.READY
    ]
    loading = [wire.LoadingModel(id=v.model) for v in views if v.state is SlotState.LOADING]
    concurrency = {m.name: m.concurrency for m in pool.file.models}
    on_gpu = any(pool.host.backends[v.model].device == "cuda" for v in views)
    document = wire.CapabilitiesDocument(
        runner_type="conduit-pool" if only is None else f"conduit-pool-{only}",
        runner_id=pool.runner_id if only is None else f"{pool.runner_id}/{only}",
        models=wire.ModelInventory(
            loaded=loaded, loading=loading, available=[v.model for v in views]
        ),
        queue=wire.QueueState(
            depth=pool.core.queued(),
            max_depth=pool.file.max_queue_depth,
            slots=sum(concurrency[v.model] for v in views),
            slotsInUse=sum(v.in_flight for v in views),
        ),
        capabilities=wire.Features(
            streaming=True, multi_tenant=True, modelLoad=True, cancel=True, modelPool=True
        ),
        health=wire.RunnerHealth.HEALTHY,
        hardware="gpu" if on_gpu else "cpu",
        cogVersion=COG_VERSION,
        startedAt=pool.started_at,
        generatedAt=datetime.now(UTC).isoformat(),
        slots=[_slot_document(pool, v) for v in views],
        budgets={str(d): b for d, b in pool.core.budgets().items()},
        used={str(d): pool.core.used(d) for d in pool.core.budgets()},
    )
    return document.wire()


async def capabilities(request: web.Request) -> web.Response:
    return _json(_capabilities(request.app[POOL]))


async def slot_capabilities(request: web.Request) -> web.Response:
    pool, name = request.app[POOL], request.match_info["model"]
    pool.backend(name)
    return _json(_capabilities(pool, name))


async def _authorised(
    pool: Pool, body: LifecycleRequest, operation: wire.Operation, model: str
) -> None:
    """:mod:`runners.control`'s rule: a lifecycle call needs an operation token for it."""
    if pool.op_tokens is None:
        raise OpTokensNotConfiguredError()
    if not body.verified_op_token:
        raise OpTokenRequiredError(operation)
    await pool.op_tokens.verify(body.verified_op_token, operation, model)


def _known(pool: Pool, model: str, field_name: str) -> None:
    if model not in pool.host.backends:
        raise InvalidFieldError(field_name, f"{field_name}: this pool has no model {model!r}")


async def load_model(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    body = await _body(request, LoadRequest)
    await _authorised(pool, body, wire.Operation.MODEL_LOAD, body.model_id)
    _known(pool, body.model_id, "modelId")
    if body.evict_model is not None:
        _known(pool, body.evict_model, "evictModel")
    op = _LoadOp(uuid.uuid4().hex, body.model_id, body.evict_model, _now())
    pool.loads[op.task_id] = op

    async def run() -> None:
        done = await pool.host.admin_load(op.model_id, op.evict)
        op.status = LoadStatus.FAILED if done.error else LoadStatus.COMPLETED
        op.error, op.completed_at = done.error, _now()

    pool.spawn(run())
    response = _json(op.document(), 202)
    response.headers[wire.LOCATION] = wire.LOAD_TASK_PATH.format(task_id=op.task_id)
    return response


async def load_task(request: web.Request) -> web.Response:
    task_id = request.match_info["task_id"]
    op = request.app[POOL].loads.get(task_id)
    if op is None:
        raise UnknownTaskError(task_id)
    return _json(op.document())


async def unload_model(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    body = await _body(request, UnloadRequest)
    await _authorised(pool, body, wire.Operation.MODEL_UNLOAD, body.model_id)
    _known(pool, body.model_id, "modelId")
    before_view, rss_before = pool.view(body.model_id), process_rss()
    done = await pool.host.admin_unload(body.model_id)
    if done.error is not None:
        raise LifecycleConflictError(f"Cannot unload {body.model_id}: {done.error}")
    freed = before_view.lease_bytes * len(before_view.devices)
    on_gpu = pool.host.backends[body.model_id].device == "cuda"
    rss_after = process_rss()
    return _json(
        UnloadResult(
            model_id=body.model_id,
            gpu_memory_freed_mb=freed // MIB if on_gpu else 0,
            kv_cache_flushed=True,
            freed_bytes=freed,
            model_bytes=freed,
            cache_bytes=0,
            rss_before_bytes=rss_before,
            rss_after_bytes=rss_after,
            rss_delta_bytes=rss_after - rss_before,
        )
    )


async def flush_cache(request: web.Request) -> web.Response:
    """Flush every loaded in-process slot's result cache (and, for ``all``/``model``, the
    model's own caches); a Cog server keeps none."""
    pool = request.app[POOL]
    body = await _body(request, FlushRequest)
    scope, value = body.scope, body.value
    if scope is not wire.FlushScope.ALL and value is None:
        raise InvalidFieldError(body.value_field, f"{body.value_field} must be a non-empty string")
    model = value if scope is wire.FlushScope.MODEL and value else "pool"
    await _authorised(pool, body, wire.Operation.CACHE_FLUSH, model)
    entries = freed = 0
    for name, backend in pool.host.backends.items():
        service = backend.service if isinstance(backend, ConduitBackend) else None
        if service is None or (scope is wire.FlushScope.MODEL and value != name):
            continue
        outcome = await service.flush(scope, service.model.name if value == name else value)
        entries, freed = entries + outcome.cache.entries, freed + outcome.cache.bytes_freed
    echoed: dict[str, Any] = {} if value is None else {scope.value: value}
    result = FlushResult(
        flushed=True,
        entries_removed=entries,
        memory_freed_mb=freed // MIB,
        scope=scope,
        freed_bytes=freed,
        model_cache=None,
        **echoed,
    )
    return _json(result)


async def health(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    reasons = ["stopping"] if pool.host.closing else []
    views = pool.core.slots()
    ready = sum(1 for v in views if v.state is SlotState.READY)
    document = HealthDocument(
        status=wire.RunnerHealth.UNHEALTHY if reasons else wire.RunnerHealth.HEALTHY,
        uptime=math.floor(time.monotonic() - pool.began),
        models_loaded=ready,
        queue_depth=pool.core.queued(),
        reasons=reasons,
        model=ModelStatus(id="pool", state=f"{ready}/{len(views)} ready"),
        queue=wire.QueueBounds(depth=pool.core.queued(), max_depth=pool.file.max_queue_depth),
    )
    return _json(document, 503 if reasons else 200)


async def slot_health_document(request: web.Request) -> web.Response:
    """The spec's ``GET /health`` for one slot, as a single runner answers it, so a director
    pointed at the slot is ready when the slot can serve: an idle slot loads on demand and is
    healthy; one whose load failed (in its cooldown) or a pool that stops is not (503)."""
    pool, name = request.app[POOL], request.match_info["model"]
    pool.backend(name)
    view = pool.view(name)
    reasons = ["stopping"] if pool.host.closing else []
    if view.state is SlotState.FAILED:
        reasons.append(f"model {view.state.value}")
    depth, max_depth = pool.core.queued(), pool.file.max_queue_depth
    if max_depth and depth >= max_depth:
        reasons.append("queue saturated")
    document = HealthDocument(
        status=wire.RunnerHealth.UNHEALTHY if reasons else wire.RunnerHealth.HEALTHY,
        uptime=math.floor(time.monotonic() - pool.began),
        models_loaded=1 if view.state is SlotState.READY else 0,
        queue_depth=depth,
        reasons=reasons,
        model=ModelStatus(id=name, state=view.state.value),
        queue=wire.QueueBounds(depth=depth, max_depth=max_depth),
    )
    return _json(document, 503 if reasons else 200)


async def root_health_check(request: web.Request) -> web.Response:
    status = "UNHEALTHY" if request.app[POOL].host.closing else wire.HealthStatus.READY.value
    return _json({"status": status, "models": [m.name for m in request.app[POOL].file.models]})


async def root(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    return _json(
        {
            "cog_version": COG_VERSION,
            "models": {m.name: f"/models/{m.name}" for m in pool.file.models},
            "capabilities_url": wire.CAPABILITIES_PATH,
            "healthcheck_url": wire.HEALTH_CHECK_PATH,
        }
    )


async def shutdown(request: web.Request) -> web.Response:
    require_internal(request, "shutdown")
    request.app[POOL].shutdown.set()
    return _json({})


class PoolCollector:
    """The pool's figures, read from the core at each scrape."""

    _BUCKETS: ClassVar[tuple[float, ...]] = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        core, now = self.pool.core, self.pool.host.now()
        stats = core.stats
        for name, counts, text in (
            ("loads", stats.loads_total, "Model loads started, by why"),
            ("evictions", stats.evictions_total, "Unloads forced by memory or an operator"),
            ("unloads", stats.unloads_total, "Every unload, by its reason"),
        ):
            family = CounterMetricFamily(f"conduit_pool_{name}", text, labels=["reason"])
            for reason, count in sorted(counts.items()):
                family.add_metric([reason], count)
            yield family
        requests = CounterMetricFamily("conduit_pool_requests", "Requests the core has seen")
        requests.add_metric([], stats.requests_total)
        yield requests
        seconds = sorted(stats.load_seconds)
        buckets = [(str(b), sum(1 for s in seconds if s <= b)) for b in self._BUCKETS]
        load = HistogramMetricFamily("conduit_pool_load_seconds", "Time a load took")
        load.add_metric([], [*buckets, ("+Inf", len(seconds))], sum(seconds))
        yield load
        thrash = GaugeMetricFamily(
            "conduit_pool_thrash_ratio", "Loads / requests over the last window (5 min)"
        )
        thrash.add_metric([], stats.thrash_ratio(now))
        yield thrash
        queue = GaugeMetricFamily("conduit_pool_queue_depth", "Requests waiting in the core")
        queue.add_metric([], core.queued())
        yield queue
        state = GaugeMetricFamily(
            "conduit_pool_slot_state", "1 for each slot's current state", labels=["model", "state"]
        )
        in_flight = GaugeMetricFamily(
            "conduit_pool_slot_in_flight", "Requests running", labels=["model"]
        )
        lease = GaugeMetricFamily(
            "conduit_pool_slot_lease_bytes", "Bytes leased per device", labels=["model"]
        )
        for view in core.slots():
            for each in SlotState:
                state.add_metric([view.model, each.value], 1.0 if view.state is each else 0.0)
            in_flight.add_metric([view.model], view.in_flight)
            lease.add_metric([view.model], view.lease_bytes)
        yield from (state, in_flight, lease)
        budget = GaugeMetricFamily("conduit_pool_budget_bytes", "Budget", labels=["device"])
        used = GaugeMetricFamily("conduit_pool_leased_bytes", "Leased", labels=["device"])
        for device, total in core.budgets().items():
            budget.add_metric([str(device)], total)
            used.add_metric([str(device)], core.used(device))
        yield from (budget, used)


async def metrics(request: web.Request) -> web.Response:
    registry = CollectorRegistry()
    registry.register(PoolCollector(request.app[POOL]))
    response = web.Response(body=generate_latest(registry))
    response.headers[wire.CONTENT_TYPE] = CONTENT_TYPE_LATEST
    return response


# --- the app ----------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _op_tokens(config: RunnerConfig, runner_id: str) -> OpTokenVerifier | None:
    if not os.environ.get("VERIFIED_OP_TOKEN_KEY_PATH"):
        return None
    nonces: NonceStore | None = None
    if config.redis_url:
        nonces = RedisNonceStore.from_url(config.redis_url)
    return OpTokenVerifier.from_env(runner_id=runner_id, nonce_store=nonces)


def _probe(file: PoolFile) -> MemoryProbe:
    """NVML's GPUs, read live, unless a budget is given without ``device: gpu`` (then one
    device of that budget, as on a CPU host)."""
    if file.budget is not None and file.device != "gpu":
        return FixedProbe((file.budget,))
    return SystemProbe(file.device)


def create_app(
    file: PoolFile, config: RunnerConfig | None = None, probe: MemoryProbe | None = None
) -> web.Application:
    """The pool's app; its slots' backends are built and the core started on startup."""
    config = config or RunnerConfig.from_env()
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[refusals])
    app[TOKEN_REQUIRED] = config.token is not None
    app[LOOPBACK_TRUSTED] = config.trust_loopback
    app.middlewares.append(_authenticate(config.token))
    app.middlewares.append(refuse_encoded_bodies)

    async def on_startup(app: web.Application) -> None:
        session = aiohttp.ClientSession(auto_decompress=False)
        runner_id = config.runner_id or f"{socket.gethostname()}:{os.getpid()}"
        memory = app[PROBE] = probe or _probe(file)
        backends = {
            m.name: build(m.name, m.backend, m.concurrency, m.size, config, session, memory)
            for m in file.models
        }
        core = PoolCore(file.pool_config(), memory)
        host = PoolHost(core, backends)
        app[POOL] = Pool(file, host, session, runner_id, _op_tokens(config, runner_id))
        host.start()

    async def on_cleanup(app: web.Application) -> None:
        pool = app[POOL]
        for task in list(pool.tasks):
            task.cancel()
        await pool.host.close()
        await pool.session.close()
        if pool.op_tokens is not None:
            await pool.op_tokens.nonces.aclose()
        if isinstance(memory := app[PROBE], SystemProbe):
            memory.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    r = app.router
    r.add_get(wire.ROOT_PATH, root)
    r.add_get(wire.HEALTH_CHECK_PATH, root_health_check)
    r.add_post(wire.SHUTDOWN_PATH, shutdown)
    r.add_get(wire.CAPABILITIES_PATH, capabilities)
    r.add_post(wire.LOAD_PATH, load_model)
    r.add_get(wire.LOAD_TASK_PATH, load_task)
    r.add_post(wire.UNLOAD_PATH, unload_model)
    r.add_post(wire.CACHE_FLUSH_PATH, flush_cache)
    r.add_get(wire.HEALTH_PATH, health)
    r.add_get(wire.METRICS_PATH, metrics)
    slot = "/models/{model}"
    r.add_get(slot, slot_root)
    r.add_get(slot + wire.ROOT_PATH, slot_root)
    r.add_get(slot + wire.HEALTH_CHECK_PATH, slot_health)
    r.add_get(slot + wire.OPENAPI_PATH, slot_openapi)
    r.add_get(slot + wire.CAPABILITIES_PATH, slot_capabilities)
    r.add_get(slot + wire.HEALTH_PATH, slot_health_document)
    r.add_post(slot + wire.PREDICTIONS_PATH, predict)
    r.add_put(slot + wire.PREDICTION_PATH, predict)
    r.add_post(slot + wire.CANCEL_PATH, cancel)
    return app


async def run(app: web.Application, host: str, port: int) -> None:
    """Serve until SIGTERM, SIGINT or ``POST /shutdown``; then stop every backend."""
    # Bodies as sent: an encoded one is refused (runners.encoding), never inflated.
    runner = web.AppRunner(
        app, handler_cancellation=True, handle_signals=False, auto_decompress=False
    )
    await runner.setup()
    loop = asyncio.get_running_loop()
    stop = app[POOL].shutdown
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("model pool listening on %s:%s", host, port)
        if not app[TOKEN_REQUIRED] and not is_loopback_host(host):
            log.warning("listening on %s without CONDUIT_RUNNER_TOKEN", host)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("shutting down")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()


def serve(config_path: str, host: str, port: int) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    file = load(config_path)
    probe = _probe(file)
    try:  # a configuration the core refuses (pins over the budget) stops here, not mid-start
        PoolCore(file.pool_config(), probe)
    except PoolConfigError as error:  # NoDeviceError too: device: gpu, and NVML finds none
        raise SystemExit(f"conduit runner pool: {error}") from None
    finally:
        if isinstance(probe, SystemProbe):
            probe.close()
    asyncio.run(run(create_app(file), host, port))
