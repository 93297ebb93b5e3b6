"""The runner's logic, apart from HTTP: the model's lifecycle, admission, in-flight predictions,
the result cache, metrics and shutdown.

It owns what coglet's ``PredictionService`` owns — the model (set up in the background, so
health can say ``STARTING``), the in-flight table that idempotent PUT and cancel look up (an id
is forgotten as soon as its prediction finishes), the webhook dispatcher — plus the control
plane: a bounded priority queue in front of the ``concurrency`` slots, per-tenant rate limits,
load/unload/flush, and the figures ``/v1/capabilities``, ``/health`` and ``/metrics`` report.
It does not know HTTP; it raises :mod:`runners.errors` (and :mod:`runners.request_errors`) for
requests it refuses. What a request asks and gets back is in :mod:`runners.admission`, what a
control call did in :mod:`runners.control_outcomes`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import socket
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from protocol.documents import PredictionRequest
from protocol.values import FlushScope, HealthStatus, RunnerStatus
from runners import COG_VERSION
from runners.admission import Admitted, RequestOptions
from runners.cache import CacheView, ResultCache
from runners.capabilities import CapabilitiesCache, build_capabilities
from runners.config import RunnerConfig
from runners.control_errors import LifecycleConflictError, UnknownModelError
from runners.control_outcomes import FlushOutcome, UnloadOutcome
from runners.control_plane import op_token_verifier
from runners.errors import ModelNotLoadedError, NotReadyError, RateLimitedError
from runners.file_inputs import file_fields
from runners.files import PredictionFiles
from runners.lifecycle import LoadTask, ModelLifecycle, ModelState
from runners.metrics import RunnerMetrics
from runners.model import Model
from runners.prediction import Prediction
from runners.ratelimit import TenantRateLimiter
from runners.resources import CpuMeter, GpuMonitor, process_rss, system_memory
from runners.scheduler import Scheduler
from runners.streaming import SnapshotStream
from runners.validation import InputValidator
from runners.webhooks import SnapshotSink, WebhookDispatcher

log = logging.getLogger(__name__)


class RunnerService:
    def __init__(
        self, model: Model, concurrency: int, config: RunnerConfig, metrics: RunnerMetrics
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.model = model
        self.concurrency = concurrency
        self.config = config
        self.runner_id = config.runner_id or f"{socket.gethostname()}:{os.getpid()}"
        self.schema = model.openapi_schema()
        self.validator = InputValidator(self.schema)
        self.file_fields = file_fields(self.schema)
        self.webhooks = WebhookDispatcher(config)
        self.lifecycle = ModelLifecycle(model)
        self.scheduler = Scheduler(concurrency, config.max_queue_depth)
        self.limiter = TenantRateLimiter.from_env()
        self.metrics = metrics
        self.cache = ResultCache(config.cache_max_bytes, on_lookup=self._count_lookup)
        self.op_tokens = op_token_verifier(config, self.runner_id)
        self.shutdown_requested = asyncio.Event()
        self.started_at = datetime.now(UTC).isoformat()
        self._began = time.monotonic()
        self._inflight: dict[str, Prediction] = {}
        self._drivers: set[asyncio.Task[None]] = set()
        self._setup_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._cpu = CpuMeter()
        self._gpus = GpuMonitor()
        self._model_cache_lookups = {True: 0, False: 0}
        self._capabilities = CapabilitiesCache(config.capabilities_ttl)

    # lifecycle

    async def start(self) -> None:
        """Open the webhook session and start setup (the first load) in the background."""
        await self.webhooks.start()
        self._setup_task = self.lifecycle.start_setup()

    async def wait_ready(self) -> bool:
        """Wait for setup to end; True if it succeeded."""
        if self._setup_task is not None:
            await asyncio.shield(self._setup_task)
        return self.ready

    async def stop(self) -> None:
        """Let in-flight predictions finish within the grace period, cancel the rest, and
        give their terminal webhooks the same time again before closing the session."""
        grace = self.config.shutdown_grace
        self._stopping = True  # a request still arriving on an open connection is refused
        if self._drivers:
            _, pending = await asyncio.wait(set(self._drivers), timeout=grace)
            if pending:
                log.warning("canceling %d predictions still running at shutdown", len(pending))
                for prediction in list(self._inflight.values()):
                    prediction.cancel()
                await asyncio.wait(pending, timeout=grace)
        self.lifecycle.cancel()
        await self.webhooks.close(timeout=grace)
        if self.op_tokens is not None:
            await self.op_tokens.nonces.aclose()

    # state

    @property
    def ready(self) -> bool:
        return self.lifecycle.loaded

    @property
    def starting(self) -> bool:
        return self.lifecycle.setup_result["status"] == RunnerStatus.STARTING

    @property
    def uptime(self) -> float:
        """Seconds since the service was built."""
        return time.monotonic() - self._began

    @property
    def stopping(self) -> bool:
        return self._stopping

    def health(self) -> dict[str, Any]:
        """coglet's ``/health-check`` document."""
        state = self.lifecycle.state
        if state is ModelState.FAILED:
            status = HealthStatus.SETUP_FAILED
        elif not self.ready:
            status = HealthStatus.STARTING
        elif self.scheduler.in_use >= self.concurrency:
            status = HealthStatus.BUSY  # coglet's meaning: every slot is running a model
        else:
            status = HealthStatus.READY
        return {
            "status": status.value,
            "setup": dict(self.lifecycle.setup_result),
            "version": {"coglet": COG_VERSION, "python": platform.python_version()},
        }

    async def problems(self) -> list[str]:
        """Why the runner is unhealthy (``GET /health``); empty when it is healthy."""
        if self.starting:
            return ["starting"]
        reasons = ["stopping"] if self._stopping else []
        if self.lifecycle.state is not ModelState.LOADED:
            reasons.append(f"model {self.lifecycle.state.value}")
        if await self.out_of_memory():
            reasons.append("out of memory")
        if self.config.max_queue_depth and self.scheduler.saturated:
            reasons.append("queue saturated")
        return reasons

    async def out_of_memory(self) -> bool:
        limit = self.config.memory_limit
        if limit is not None and process_rss() > limit:
            return True
        floor = self.config.min_free_memory
        _, available = system_memory()
        if available is not None and available < floor:
            return True
        if not self.model.device.startswith("cuda"):
            return False
        devices = await self._gpus.devices()
        return any(
            device.memory_free is not None and device.memory_free < floor for device in devices
        )

    def get(self, prediction_id: str) -> Prediction | None:
        return self._inflight.get(prediction_id)

    # predictions

    def submit(
        self,
        prediction_id: str,
        request: PredictionRequest,
        trace: Mapping[str, str],
        options: RequestOptions | None = None,
    ) -> Admitted:
        """Validate, admit (a slot or a queue place), count against the tenant's limit and
        start; raises :mod:`runners.errors`."""
        options = options or RequestOptions()
        inputs = self.validator.prepare(request.input)
        sender = self.fallback(request, trace)  # a refused webhook is refused before admission
        if self._stopping or self.starting or self.lifecycle.state is ModelState.FAILED:
            raise NotReadyError()
        if not self.ready:
            raise ModelNotLoadedError(self.model.name)
        ticket = self.scheduler.admit(options.priority)
        try:
            rate = self.limiter.check(options.tenant)
        except RateLimitedError:
            self.scheduler.release(ticket)
            raise
        stream = None
        if options.stream:
            stream = SnapshotStream(request.webhook_events_filter, fallback=sender)
        cache = CacheView(
            self.cache, self.model.name, options.tenant, options.cache_mode, options.cache_tag
        )
        prediction = Prediction(
            prediction_id,
            inputs,
            request.context,
            stream or sender,
            ticket=ticket,
            scheduler=self.scheduler,
            tenant=options.tenant,
            cache=cache,
            on_gpu=self.model.device.startswith("cuda"),
            files=PredictionFiles(
                self.webhooks.session, self.file_fields, request.output_file_prefix, self.config
            ),
        )
        self._inflight[prediction_id] = prediction
        driver = prediction.start(self.model, self._release)
        self._drivers.add(driver)
        driver.add_done_callback(self._drivers.discard)
        return Admitted(prediction, rate, stream)

    def fallback(
        self, request: PredictionRequest, trace: Mapping[str, str] | None = None
    ) -> SnapshotSink | None:
        """The request's webhook sender, if it named a webhook; raises
        :class:`runners.request_errors.WebhookRefusedError` for one the SSRF guard refuses."""
        if not request.webhook:
            return None
        return self.webhooks.sender(request.webhook, request.webhook_events_filter, trace or {})

    def refused(self, tenant: str, reason: str) -> None:
        self.metrics.requests.labels(self.model.name, tenant, reason).inc()

    def _release(self, prediction: Prediction) -> None:
        if self._inflight.get(prediction.id) is prediction:
            del self._inflight[prediction.id]
        name = self.model.name
        self.metrics.requests.labels(name, prediction.tenant, prediction.status.value).inc()
        self.metrics.queue_wait.labels(name).observe(prediction.queue_wait_time)
        if prediction.predict_time:
            self.metrics.inference.labels(name).observe(prediction.predict_time)
        for hit, count in prediction.model_cache_lookups().items():
            if count:
                self._model_cache_lookups[hit] += count
                self.metrics.cache_lookups.labels("model", "hit" if hit else "miss").inc(count)

    def cancel(self, prediction_id: str) -> bool:
        prediction = self._inflight.get(prediction_id)
        return prediction is not None and prediction.cancel()

    # control

    def check_model(self, model_id: str | None) -> None:
        if model_id is not None and model_id != self.model.name:
            raise UnknownModelError(model_id, self.model.name)

    def load(self, model_id: str, evict: str | None) -> LoadTask:
        self.check_model(model_id)
        if evict is not None:
            self.check_model(evict)
            self._refuse_while_running("evict")
        if self.lifecycle.current is not None:
            raise LifecycleConflictError(f"Model {model_id} is already being loaded")
        task = self.lifecycle.start_load(evict)
        self._capabilities.invalidate()
        return task

    async def unload(self, model_id: str) -> UnloadOutcome:
        self.check_model(model_id)
        if self.lifecycle.current is not None:
            raise LifecycleConflictError(f"Model {model_id} is being loaded")
        if not self.ready:
            raise LifecycleConflictError(f"Model {model_id} is not loaded")
        self._refuse_while_running("unload")
        unloaded = await self.lifecycle.unload()
        cache = self.cache.flush(FlushScope.MODEL, model_id)
        self._capabilities.invalidate()
        return UnloadOutcome(unloaded, cache)

    async def flush(self, scope: FlushScope, value: str | None) -> FlushOutcome:
        """Drop cache entries in scope, and the model's own caches for ``all`` and ``model``.
        The model goes first: when it refuses (:class:`CacheBusyError`) nothing is dropped."""
        if scope is FlushScope.MODEL:
            self.check_model(value)
        model = None
        if scope in (FlushScope.ALL, FlushScope.MODEL) and self.ready:
            model = await self.model.flush_cache()
        flushed = self.cache.flush(scope, value)
        self._capabilities.invalidate()
        return FlushOutcome(flushed, model)

    def _refuse_while_running(self, action: str) -> None:
        if self._inflight:
            raise LifecycleConflictError(
                f"Cannot {action} {self.model.name}: {len(self._inflight)} predictions are "
                "running or queued; retry when they have finished"
            )

    # reporting

    async def capabilities(self) -> dict[str, Any]:
        """The capabilities document's JSON, rebuilt at most every ``capabilities_ttl`` s."""
        body = self._capabilities.get()
        if body is None:
            reasons, gpus = await self.problems(), await self._gpus.devices()
            body = self._capabilities.put(build_capabilities(self, reasons, gpus, self._cpu))
        return body

    def metrics_exposition(self) -> bytes:
        def gauges() -> dict[str, float]:
            _, available = system_memory()
            return {
                "queue_depth": self.scheduler.depth,
                "slots_in_use": self.scheduler.in_use,
                "cache_hit_ratio": self.cache_hit_ratio(),
                "memory_rss": process_rss(),
                "memory_model": self.model.memory_bytes() if self.ready else 0,
                "memory_cache": self.cache.bytes_used,
                "memory_system_free": available or 0,
            }

        self.metrics.refresh(gauges)
        return self.metrics.exposition()

    def cache_hit_ratio(self) -> float:
        """Hits over lookups, the result cache's and the model's own caches' together."""
        hits = self.cache.hits + self._model_cache_lookups[True]
        lookups = hits + self.cache.misses + self._model_cache_lookups[False]
        return hits / lookups if lookups else 0.0

    def _count_lookup(self, hit: bool) -> None:
        self.metrics.cache_lookups.labels("result", "hit" if hit else "miss").inc()
