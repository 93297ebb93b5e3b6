"""``GET /v1/capabilities``: the runner API spec's capability document, built from what the
runner measures (:mod:`runners.resources`) and holds (its model, queue and settings).

The spec's fields come first and carry its names and units; Conduit's additions ride along
under names of their own (``hardware``, ``healthReasons``, per-device figures in bytes, ...).
Nothing is estimated: a figure the runner cannot measure is ``null``; on a host without a GPU
the GPU figures are 0 and empty, as measured.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from protocol.documents import (
    CapabilitiesDocument,
    Features,
    GpuResources,
    LoadedModel,
    LoadingModel,
    ModelInventory,
    QueueState,
)
from protocol.values import FlushScope, Priority, RunnerHealth
from runners import COG_VERSION
from runners.cache import CacheMode
from runners.resources import MIB, CpuMeter, Device, gpu_resources, host_resources

if TYPE_CHECKING:
    from runners.service import RunnerService


def build_capabilities(
    service: RunnerService, reasons: list[str], gpus: list[Device], cpu: CpuMeter
) -> CapabilitiesDocument:
    model = service.model
    on_gpu = model.device.startswith("cuda")
    return CapabilitiesDocument(
        runner_type=f"conduit-{model.name}",
        runner_id=service.runner_id,
        models=_inventory(service),
        resources=_resources(service, gpus, cpu),
        queue=_queue(service),
        capabilities=Features(
            streaming=True,
            prefix_caching=model.prefix_caching,
            multi_tenant=True,
            vision_input=False,
            audio_input=False,
            function_calling=False,
            **_conduit_features(service),
        ),
        health=RunnerHealth.UNHEALTHY if reasons else RunnerHealth.HEALTHY,
        hardware="gpu" if on_gpu else "cpu",
        healthReasons=reasons,
        cogVersion=COG_VERSION,
        startedAt=service.started_at,
        generatedAt=datetime.now(UTC).isoformat(),
    )


def _inventory(service: RunnerService) -> ModelInventory:
    lifecycle, model = service.lifecycle, service.model
    loaded, loading = [], []
    if lifecycle.loaded:
        held = model.memory_bytes()
        loaded_at = lifecycle.loaded_at
        loaded.append(
            LoadedModel(
                id=model.name,
                quantization=model.quantization,
                context_length=model.context_length(),
                loaded_at=None if loaded_at is None else math.floor(loaded_at),
                gpu_memory_mb=held // MIB if model.device.startswith("cuda") else 0,
                device=model.device,
                memoryBytes=held,
                loadTimeSeconds=lifecycle.last_load_time,
                **model.extra_capabilities(),
            )
        )
    if (task := lifecycle.current) is not None:
        eta = lifecycle.eta(task)
        loading.append(
            LoadingModel(
                id=task.model_id,
                progress=round(lifecycle.progress(task), 4),
                eta=None if eta is None else math.ceil(eta),
                taskId=task.id,
            )
        )
    return ModelInventory(loaded=loaded, loading=loading, available=[model.name])


def _resources(service: RunnerService, gpus: list[Device], cpu: CpuMeter) -> GpuResources:
    kv_bytes, kv_usage = service.model.kv_cache() if service.ready else (0, 0.0)
    return GpuResources(
        **gpu_resources(gpus),
        kv_cache_size_mb=None if kv_bytes is None else kv_bytes // MIB,
        kv_cache_utilization=kv_usage,
        **host_resources(cpu, gpus),
    )


def _queue(service: RunnerService) -> QueueState:
    waits = service.scheduler.wait_stats()
    return QueueState(
        depth=service.scheduler.depth,
        max_depth=service.config.max_queue_depth,
        avg_wait_ms=round(waits["avg_wait_ms"]),
        p95_wait_ms=round(waits["p95_wait_ms"]),
        slots=service.concurrency,
        slotsInUse=service.scheduler.in_use,
    )


def _conduit_features(service: RunnerService) -> dict[str, Any]:
    return {
        "cancel": True,
        "priorities": [priority.value for priority in Priority],
        "cacheModes": [mode.value for mode in CacheMode],
        "cacheFlushScopes": [scope.value for scope in FlushScope],
        "modelLoad": True,
        "tenantRateLimits": service.limiter.enabled,
        "opTokens": service.op_tokens is not None,
    }


class CapabilitiesCache:
    """The document, rebuilt at most every ``ttl`` seconds (the spec's 5 s cache)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._built: tuple[float, dict[str, Any]] | None = None

    def get(self) -> dict[str, Any] | None:
        if self._built is None or time.monotonic() - self._built[0] >= self.ttl:
            return None
        return self._built[1]

    def put(self, document: CapabilitiesDocument) -> dict[str, Any]:
        body = document.wire()
        self._built = (time.monotonic(), body)
        return body

    def invalidate(self) -> None:
        self._built = None
