"""A single runner's side of the control API (:class:`runners.control_plane.ControlPlane`): its
one model's load, unload and caches, and its figures, read from :class:`RunnerService`.

Answers carry the spec's figures beside Conduit's own (bytes, RSS before and after); a
figure the runner cannot measure is ``null``, never a guess.
"""

from __future__ import annotations

import math
from typing import Any

from protocol.documents import QueueBounds
from protocol.lifecycle import (
    FlushResult,
    HealthDocument,
    LoadTask,
    ModelCacheFreed,
    ModelStatus,
    UnloadResult,
)
from protocol.values import FlushScope, RunnerHealth
from runners.control_errors import StartingError, StoppingError, UnknownTaskError
from runners.control_outcomes import FlushOutcome
from runners.control_plane import ControlPlane
from runners.model import ModelCacheFlush
from runners.optokens import OpTokenVerifier
from runners.resources import MIB
from runners.service import RunnerService


class RunnerControlPlane(ControlPlane):
    def __init__(self, service: RunnerService) -> None:
        self.service = service

    @property
    def op_tokens(self) -> OpTokenVerifier | None:
        return self.service.op_tokens

    @property
    def name(self) -> str:
        return self.service.model.name

    async def capabilities(self) -> dict[str, Any]:
        service = self.service
        if service.starting:
            raise StartingError()
        if service.stopping:
            raise StoppingError()
        return await service.capabilities()

    def load(self, model_id: str, evict: str | None) -> LoadTask:
        service = self.service
        return service.lifecycle.describe(service.load(model_id, evict))

    def load_task(self, task_id: str) -> LoadTask:
        lifecycle = self.service.lifecycle
        task = lifecycle.tasks.get(task_id)
        if task is None:
            raise UnknownTaskError(task_id)
        return lifecycle.describe(task)

    async def unload(self, model_id: str) -> UnloadResult:
        service = self.service
        outcome = await service.unload(model_id)
        on_gpu = service.model.device.startswith("cuda")
        rss = outcome.unloaded.rss
        return UnloadResult(
            model_id=model_id,
            gpu_memory_freed_mb=outcome.unloaded.model_bytes // MIB if on_gpu else 0,
            kv_cache_flushed=True,  # the model's caches went with it
            freed_bytes=outcome.freed_bytes,
            model_bytes=outcome.unloaded.model_bytes,
            cache_bytes=outcome.cache.bytes_freed,
            rss_before_bytes=rss.before,
            rss_after_bytes=rss.after,
            rss_delta_bytes=rss.delta,
        )

    async def flush(self, scope: FlushScope, value: str | None) -> FlushResult:
        outcome = await self.service.flush(scope, value)
        echoed: dict[str, Any] = {} if value is None else {scope.value: value}
        return FlushResult(
            flushed=True,
            entries_removed=outcome.cache.entries,
            memory_freed_mb=_memory_freed_mb(outcome),
            scope=scope,
            freed_bytes=outcome.cache.bytes_freed,
            model_cache=_model_cache(outcome.model),
            **echoed,
        )

    async def health(self) -> HealthDocument:
        service = self.service
        reasons = await service.problems()
        return HealthDocument(
            status=RunnerHealth.UNHEALTHY if reasons else RunnerHealth.HEALTHY,
            uptime=math.floor(service.uptime),
            models_loaded=1 if service.ready else 0,
            queue_depth=service.scheduler.depth,
            reasons=reasons,
            model=ModelStatus(id=service.model.name, state=service.lifecycle.state.value),
            queue=QueueBounds(
                depth=service.scheduler.depth, max_depth=service.config.max_queue_depth
            ),
        )

    def metrics(self) -> bytes:
        return self.service.metrics_exposition()


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
