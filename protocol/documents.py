"""The runner contract's bodies: Cog's prediction request and snapshot and health check, and the
control API's documents with the runner API spec's field names (the lifecycle calls' are in
:mod:`protocol.lifecycle`)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from protocol.values import (
    ALL_WEBHOOK_EVENTS,
    ErrorCode,
    HealthStatus,
    RunnerHealth,
    RunnerStatus,
    WebhookEvent,
)


class PredictionRequest(BaseModel):
    """Body of ``PUT /predictions/{id}`` and ``POST /predictions``."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    context: dict[str, str] = Field(default_factory=dict)
    webhook: str | None = None
    webhook_events_filter: list[WebhookEvent] = Field(
        default_factory=lambda: list(ALL_WEBHOOK_EVENTS)
    )
    #: Cog's field: file outputs are uploaded by ``PUT {prefix}{filename}`` and become the
    #: answer's ``Location``; without it they are sent as ``data:`` URLs.
    output_file_prefix: str | None = None


class PredictionResponse(BaseModel):
    """A runner's snapshot of a prediction: webhook bodies and synchronous responses."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    status: RunnerStatus
    output: Any = None
    logs: str = ""
    error: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    input: dict[str, Any] | None = None


class SetupResult(BaseModel):
    started_at: str | None = None
    completed_at: str | None = None
    status: str = "starting"
    logs: str = ""


class HealthCheck(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: HealthStatus
    setup: SetupResult | None = None


# The control API's documents, with the runner API spec's field names (camelCase; sizes in MB,
# times in ms, instants in epoch seconds). Every field has a default so a director can read a
# runner that reports less; fields beyond the spec's are Conduit's and are welcome on the wire.


class _Document(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    _sparse: ClassVar[bool] = False
    """Conduit's optional members are left out until set (the spec's are always sent)."""

    def wire(self) -> dict[str, Any]:
        """The JSON body, by the spec's names."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=self._sparse)


class LoadedModel(_Document):
    id: str
    quantization: str | None = None
    context_length: int | None = None
    loaded_at: int | None = None
    """Epoch seconds."""
    gpu_memory_mb: int = Field(0, alias="gpuMemoryMB")
    """0 for a model on the CPU."""


class LoadingModel(_Document):
    id: str
    progress: float = 0.0
    eta: int | None = None
    """Seconds left, from the last load's duration; None before any load finished."""


class ModelInventory(_Document):
    loaded: list[LoadedModel] = Field(default_factory=list)
    loading: list[LoadingModel] = Field(default_factory=list)
    available: list[str] = Field(default_factory=list)


class GpuResources(_Document):
    """GPU figures (0 and empty on a host without a GPU; None where a driver does not say)."""

    gpu_ids: list[int] = Field(default_factory=list)
    gpu_memory_total_mb: int | None = Field(0, alias="gpuMemoryTotalMB")
    gpu_memory_used_mb: int | None = Field(0, alias="gpuMemoryUsedMB")
    gpu_memory_free_mb: int | None = Field(0, alias="gpuMemoryFreeMB")
    gpu_utilization: float | None = 0.0
    kv_cache_size_mb: int | None = Field(0, alias="kvCacheSizeMB")
    kv_cache_utilization: float | None = 0.0


class QueueBounds(_Document):
    depth: int = 0
    max_depth: int = 0


class QueueState(QueueBounds):
    avg_wait_ms: int = 0
    p95_wait_ms: int = 0


class Features(_Document):
    streaming: bool = False
    prefix_caching: bool = False
    multi_tenant: bool = False
    vision_input: bool = False
    audio_input: bool = False
    function_calling: bool = False


class CapabilitiesDocument(_Document):
    """``GET /v1/capabilities``: what the runner is and holds now."""

    runner_type: str | None = None
    runner_id: str | None = None
    models: ModelInventory = Field(default_factory=ModelInventory)
    resources: GpuResources = Field(default_factory=GpuResources)
    queue: QueueState = Field(default_factory=QueueState)
    capabilities: Features = Field(default_factory=Features)
    health: RunnerHealth = RunnerHealth.HEALTHY
    hardware: str | None = None
    """Conduit's: "cpu" or "gpu", where the model runs (what usage is billed as)."""


# The ``error`` member of the two refusals the spec names (the rest of each body is RFC 9457).


class QueueFullDetail(_Document):
    code: ErrorCode = ErrorCode.QUEUE_FULL
    message: str
    queue_depth: int
    avg_wait_ms: int


class RateLimitDetail(_Document):
    code: ErrorCode = ErrorCode.RATE_LIMIT_EXCEEDED
    message: str
    limit: int
    remaining: int
    reset_at: int
    """Epoch seconds."""
