"""The runner API spec's lifecycle calls (load, unload, cache flush) and ``GET /health``:
the request documents a runner reads and the answers it sends, by the spec's names.

Each request carries the ``verifiedOpToken`` of its operation (:class:`protocol.values.Operation`);
:class:`OpTokenEnvelope` is that token's JSON before encoding (:mod:`runners.optokens`).
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from protocol.documents import QueueBounds, _Document
from protocol.values import FlushScope, Operation, RunnerHealth

NonEmpty = Annotated[str, Field(min_length=1)]


class LifecycleRequest(_Document):
    verified_op_token: str | None = None
    """Missing or empty: the call is refused with 401."""


class LoadRequest(LifecycleRequest):
    """``POST /v1/models/load``. The runner serves one model, so the budget fields are read
    but not acted on; ``evictModel`` is unloaded first."""

    model_id: NonEmpty
    quantization: str | None = None
    max_context_length: int | None = None
    gpu_memory_budget_mb: int | None = Field(None, alias="gpuMemoryBudgetMB")
    evict_model: NonEmpty | None = None


class LoadStatus(enum.StrEnum):
    LOADING = "loading"
    COMPLETED = "completed"
    FAILED = "failed"


class LoadTask(_Document):
    """The 202 answer of ``POST /v1/models/load`` and ``GET /v1/models/load/{taskId}``:
    ``eta`` (seconds) is None until one load finished, ``gpuMemoryUsedMB`` and ``loadTimeMs``
    are set once completed, ``error`` once failed. Conduit's finer ``phase`` and byte-exact
    figures ride along."""

    _sparse = True
    task_id: str
    model_id: str
    status: LoadStatus
    progress: float
    eta: int | None
    gpu_memory_used_mb: int | None = Field(None, alias="gpuMemoryUsedMB")
    load_time_ms: int | None = None
    error: str | None = None
    phase: str | None = None
    stage: str | None = None
    created_at: str | None = None
    completed_at: str | None = None
    evict_model: str | None = None
    freed_bytes: int | None = None
    memory_used_bytes: int | None = None
    load_time_seconds: float | None = None
    rss_before_bytes: int | None = None
    rss_after_bytes: int | None = None
    rss_delta_bytes: int | None = None


class UnloadRequest(LifecycleRequest):
    """``POST /v1/models/unload``."""

    model_id: NonEmpty


class UnloadResult(_Document):
    """``POST /v1/models/unload``'s answer. ``gpuMemoryFreedMB`` is 0 for a model on the CPU;
    ``freedBytes`` = ``modelBytes`` (the model's tensors) + ``cacheBytes`` (its result-cache
    entries); ``rss*`` the process's resident set measured around the unload."""

    model_id: str
    gpu_memory_freed_mb: int = Field(alias="gpuMemoryFreedMB")
    kv_cache_flushed: bool
    status: str = "unloaded"
    freed_bytes: int
    model_bytes: int
    cache_bytes: int
    rss_before_bytes: int
    rss_after_bytes: int
    rss_delta_bytes: int


class FlushRequest(LifecycleRequest):
    """``POST /v1/cache/flush``: ``modelId``, ``tenantId`` or ``tag`` names what the scope
    needs (``model`` and ``tenant`` are Conduit's older names for the first two)."""

    scope: FlushScope = FlushScope.ALL
    model_id: NonEmpty | None = None
    tenant_id: NonEmpty | None = None
    tag: NonEmpty | None = None
    model: NonEmpty | None = None
    tenant: NonEmpty | None = None

    @property
    def value_field(self) -> str:
        """The spec's name of the field the scope reads (``scope`` itself for ``all``)."""
        return _SCOPE_FIELDS[self.scope]

    @property
    def value(self) -> str | None:
        """What the scope names (None for ``all``, or when the caller left it out)."""
        if self.scope is FlushScope.MODEL:
            return self.model_id or self.model
        if self.scope is FlushScope.TENANT:
            return self.tenant_id or self.tenant
        return self.tag if self.scope is FlushScope.TAG else None


_SCOPE_FIELDS = {
    FlushScope.ALL: "scope",
    FlushScope.MODEL: "modelId",
    FlushScope.TENANT: "tenantId",
    FlushScope.TAG: "tag",
}


class ModelCacheFreed(_Document):
    """What the model's own caches (an LLM's KV cache) released; None where not measured."""

    freed_bytes: int | None
    freed_blocks: int | None


class FlushResult(_Document):
    """``POST /v1/cache/flush``'s answer. ``entriesRemoved`` counts result-cache entries;
    ``memoryFreedMB`` is the memory the flush released: the result-cache entries' bytes
    (``freedBytes``) plus what the model's own caches released (``modelCache``), or None when
    the model flushed caches it cannot measure. The scope's value is echoed under the scope's
    name (``model``, ``tenant`` or ``tag``)."""

    _sparse = True
    flushed: bool
    entries_removed: int
    memory_freed_mb: int | None = Field(alias="memoryFreedMB")
    scope: FlushScope
    freed_bytes: int
    model_cache: ModelCacheFreed | None
    model: str | None = None
    tenant: str | None = None
    tag: str | None = None


class ModelStatus(_Document):
    id: str
    state: str


class HealthDocument(_Document):
    """``GET /health`` (200 when healthy, 503 otherwise); ``reasons`` says what is wrong."""

    status: RunnerHealth
    uptime: int
    """Seconds since the runner started."""
    models_loaded: int
    queue_depth: int
    reasons: list[str] = Field(default_factory=list)
    model: ModelStatus
    queue: QueueBounds


class OpTokenClaims(_Document):
    """The signed ``opToken`` of a ``verifiedOpToken`` (:mod:`runners.optokens`)."""

    _sparse = True  # runnerId is left out unless the token names a runner

    operation: Operation
    model_id: str | None
    issued_at: int
    """Epoch seconds, as the spec writes it (a verifier also accepts ISO 8601 with a zone)."""
    signers: list[str]
    nonce: str
    runner_id: str | None = None
    """Conduit's addition: the one runner (its ``runnerId`` in capabilities) that may accept
    the token; absent, any runner holding the key may."""


class OpTokenEnvelope(_Document):
    """A ``verifiedOpToken`` before its base64url encoding."""

    op_token: OpTokenClaims
    signature: str
    """Hex HMAC-SHA256 of ``opToken`` as JSON with sorted keys and no spaces."""


def wire_names(document: type[_Document], *, required: bool = False) -> frozenset[str]:
    """The names a document's fields have on the wire (only the required ones if asked)."""
    return frozenset(
        field.alias or name
        for name, field in document.model_fields.items()
        if field.is_required() or not required
    )
