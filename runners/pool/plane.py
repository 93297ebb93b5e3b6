"""A model pool's side of the control API (:class:`runners.control_plane.ControlPlane`): the
same routes, runner token and operation tokens as a single runner, acting on every slot.

``/v1/capabilities`` lists each slot beside the spec's inventory; a load (with ``evictModel``)
and an unload go through the pool's core, which drains what they replace; a flush empties the
result caches of the loaded in-process slots (a Cog server keeps none). A model the pool does
not serve is 422 ``invalid-field`` naming the field; an unload the core refuses (a pinned
model) is 409 ``lifecycle-conflict``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from protocol.lifecycle import FlushResult, HealthDocument, LoadStatus, LoadTask, UnloadResult
from protocol.values import FlushScope
from runners.control_errors import InvalidFieldError, LifecycleConflictError, UnknownTaskError
from runners.control_plane import ControlPlane
from runners.optokens import OpTokenVerifier
from runners.pool import documents
from runners.pool.conduit_backend import ConduitBackend
from runners.pool.metrics import PoolMetrics
from runners.pool.state import Pool
from runners.resources import MIB, process_rss

POOL_NAME = "pool"
"""The ``modelId`` an operation token names for a flush of every slot."""


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


class PoolControlPlane(ControlPlane):
    def __init__(self, pool: Pool, metrics: PoolMetrics) -> None:
        self.pool = pool
        self._metrics = metrics
        self._loads: dict[str, _LoadOp] = {}

    @property
    def op_tokens(self) -> OpTokenVerifier | None:
        return self.pool.op_tokens

    @property
    def name(self) -> str:
        return POOL_NAME

    async def capabilities(self) -> dict[str, Any]:
        return documents.capabilities(self.pool)

    def _known(self, model: str, field_name: str) -> None:
        if model not in self.pool.host.backends:
            raise InvalidFieldError(field_name, f"{field_name}: this pool has no model {model!r}")

    def load(self, model_id: str, evict: str | None) -> LoadTask:
        self._known(model_id, "modelId")
        if evict is not None:
            self._known(evict, "evictModel")
        op = _LoadOp(uuid.uuid4().hex, model_id, evict, _now())
        self._loads[op.task_id] = op
        host = self.pool.host

        async def run() -> None:
            done = await host.admin_load(op.model_id, op.evict)
            op.status = LoadStatus.FAILED if done.error else LoadStatus.COMPLETED
            op.error, op.completed_at = done.error, _now()

        self.pool.spawn(run())
        return op.document()

    def load_task(self, task_id: str) -> LoadTask:
        op = self._loads.get(task_id)
        if op is None:
            raise UnknownTaskError(task_id)
        return op.document()

    async def unload(self, model_id: str) -> UnloadResult:
        pool = self.pool
        self._known(model_id, "modelId")
        before, rss_before = pool.view(model_id), process_rss()
        done = await pool.host.admin_unload(model_id)
        if done.error is not None:
            raise LifecycleConflictError(f"Cannot unload {model_id}: {done.error}")
        freed = before.lease_bytes * len(before.devices)
        on_gpu = pool.host.backends[model_id].device == "cuda"
        rss_after = process_rss()
        return UnloadResult(
            model_id=model_id,
            gpu_memory_freed_mb=freed // MIB if on_gpu else 0,
            kv_cache_flushed=True,
            freed_bytes=freed,
            model_bytes=freed,
            cache_bytes=0,
            rss_before_bytes=rss_before,
            rss_after_bytes=rss_after,
            rss_delta_bytes=rss_after - rss_before,
        )

    async def flush(self, scope: FlushScope, value: str | None) -> FlushResult:
        """Flush every loaded in-process slot's result cache (and, for ``all``/``model``, the
        model's own caches); a Cog server keeps none."""
        entries = freed = 0
        for name, backend in self.pool.host.backends.items():
            service = backend.service if isinstance(backend, ConduitBackend) else None
            if service is None or (scope is FlushScope.MODEL and value != name):
                continue
            outcome = await service.flush(scope, service.model.name if value == name else value)
            entries, freed = entries + outcome.cache.entries, freed + outcome.cache.bytes_freed
        echoed: dict[str, Any] = {} if value is None else {scope.value: value}
        return FlushResult(
            flushed=True,
            entries_removed=entries,
            memory_freed_mb=freed // MIB,
            scope=scope,
            freed_bytes=freed,
            model_cache=None,
            **echoed,
        )

    async def health(self) -> HealthDocument:
        return documents.health(self.pool)

    def metrics(self) -> bytes:
        return self._metrics.exposition()


def _now() -> str:
    return datetime.now(UTC).isoformat()
