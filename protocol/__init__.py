"""The runner contract: Cog's HTTP wire protocol plus Conduit's additions.

This package is the only thing the runners and their callers (the director, the synchronous
lane) share about runners: it imports nothing else of Conduit but :mod:`core`, and neither side
spells a media type, header name or wire value of the contract anywhere else. Beside the wire
values here: :mod:`protocol.lifecycle` (the control API's lifecycle documents),
:mod:`protocol.timings` (what a runner says about a run's time), :mod:`protocol.answers` (the
one table that reads a runner's answer), and the one client every caller uses
(:mod:`protocol.client`, with its exception tree in :mod:`protocol.errors`).

It describes what coglet 0.23.1 sends and accepts (see the reference notes): a runner's webhook
and terminal payloads carry only ``id``, ``status``, ``logs``, ``output``, ``error`` and
``metrics`` -- never ``input`` or timestamps, which the platform fills in itself.

Conduit's additions, all ignored by (and absent from) a stock Cog server:

- ``Accept: application/x-ndjson`` on a ``PUT /predictions/<id>`` asks for the prediction's
  snapshots down the response (:mod:`runners.streaming`); ``If-Match: *`` makes the ``PUT`` an
  attach that starts nothing (``412`` when the prediction is not running there).
- ``X-Tenant-ID`` and ``X-Priority`` (and ``X-Cache-Mode`` / ``X-Cache-Tag``) on requests;
  ``X-Conduit-Deadline: <seconds>`` on a start, the time left before the director gives the
  prediction up: a model pool host refuses at once what it cannot load and run in that time
  (``deadline_unmeetable``) and stops waiting for a load when it passes (``deadline_exceeded``);
  a single runner does not read it.
  ``X-Queue-Wait-Ms``, ``X-GPU-Time-Ms``, ``X-Processing-Time``, ``X-Cache-Hit`` and
  ``X-Cache-Tokens-Reused`` on every prediction response.
- The control API of the runner API spec (seed 004), whose documents are modelled with the
  spec's field names: :class:`CapabilitiesDocument` and the refusal details here, the
  lifecycle calls' requests and answers and the health document in
  :mod:`protocol.lifecycle`.
- Refusals that are not Cog's own are RFC 9457 problem+json; ``code`` names them.
- ``Authorization: Bearer <CONDUIT_RUNNER_TOKEN>`` on every request but the health checks, when
  the runner has a token (401 ``unauthorized`` without it); a stock Cog server ignores it.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# standard HTTP header names, as the runner and the director spell them
CONTENT_TYPE: Final = "Content-Type"
ACCEPT: Final = "Accept"
LOCATION: Final = "Location"
AUTHORIZATION: Final = "Authorization"
WWW_AUTHENTICATE: Final = "WWW-Authenticate"
CONTENT_ENCODING: Final = "Content-Encoding"
ACCEPT_ENCODING: Final = "Accept-Encoding"
USER_AGENT: Final = "User-Agent"
TRACE_HEADERS: Final = ("traceparent", "tracestate")
"""W3C trace context: a runner passes a prediction request's on to its webhooks."""

# media types
JSON: Final = "application/json"
NDJSON: Final = "application/x-ndjson"
"""One snapshot per line, down the response of the ``PUT`` that started the prediction."""
PROBLEM_JSON: Final = "application/problem+json"

# request headers
PREFER: Final = "Prefer"
RESPOND_ASYNC: Final = "respond-async"
"""``Prefer: respond-async``: answer 202 at once (Cog)."""
IF_MATCH: Final = "If-Match"
ATTACH: Final = "*"
"""``If-Match: *``: follow the prediction if it runs here; start nothing (412 otherwise)."""
TENANT_ID: Final = "X-Tenant-ID"
PRIORITY: Final = "X-Priority"
CACHE_MODE: Final = "X-Cache-Mode"
CACHE_TAG: Final = "X-Cache-Tag"
DEADLINE: Final = "X-Conduit-Deadline"
"""Seconds (a decimal) the prediction has left, covering queue + load + run on the runner."""

# response headers
RETRY_AFTER: Final = "Retry-After"
QUEUE_WAIT_MS: Final = "X-Queue-Wait-Ms"
GPU_TIME_MS: Final = "X-GPU-Time-Ms"
PROCESSING_TIME: Final = "X-Processing-Time"
"""Seconds (a decimal) the runner spent on the request."""
LOAD_TIME: Final = "X-Conduit-Load-Time"
"""Seconds (a decimal) a model pool held the start while its model was made ready (evictions
and the load); absent when the model was ready."""
POOL_QUEUE_WAIT: Final = "X-Conduit-Queue-Wait"
"""Seconds (a decimal) a model pool queued the start for a permit once its model was ready;
absent when it queued none."""
CACHE_HIT: Final = "X-Cache-Hit"
CACHE_TOKENS_REUSED: Final = "X-Cache-Tokens-Reused"
RATE_LIMIT_LIMIT: Final = "X-RateLimit-Limit"
RATE_LIMIT_REMAINING: Final = "X-RateLimit-Remaining"
RATE_LIMIT_RESET: Final = "X-RateLimit-Reset"


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header that carries ``token`` (the runner token, on each call)."""
    return {AUTHORIZATION: f"Bearer {token}"}


# paths: Cog's, then the control API's (the spec's)
ROOT_PATH: Final = "/"
HEALTH_CHECK_PATH: Final = "/health-check"
OPENAPI_PATH: Final = "/openapi.json"
DOCS_PATH: Final = "/docs"
SHUTDOWN_PATH: Final = "/shutdown"
PREDICTIONS_PATH: Final = "/predictions"
PREDICTION_PATH: Final = "/predictions/{id}"
CANCEL_PATH: Final = "/predictions/{id}/cancel"
#: Cog's training endpoints (a trainer: ``cog.server.http --x-mode train``), alike otherwise.
TRAINING_PATH: Final = "/trainings/{id}"
TRAINING_CANCEL_PATH: Final = "/trainings/{id}/cancel"
CAPABILITIES_PATH: Final = "/v1/capabilities"
LOAD_PATH: Final = "/v1/models/load"
LOAD_TASK_PATH: Final = "/v1/models/load/{task_id}"
UNLOAD_PATH: Final = "/v1/models/unload"
CACHE_FLUSH_PATH: Final = "/v1/cache/flush"
HEALTH_PATH: Final = "/health"
METRICS_PATH: Final = "/metrics"
PROBE_PATHS: Final = frozenset({HEALTH_CHECK_PATH, HEALTH_PATH})
"""The health checks: ``GET`` answered without the runner token, so probes need no secret."""


class Priority(enum.StrEnum):
    """``X-Priority``: how urgent a prediction is; every queue that orders by it serves high
    first.

    The members are listed most urgent first, and that order is the one rule: :attr:`rank`
    (0 the most urgent, served first: a runner's queue, the lane's bands) and :attr:`weight`
    (higher the more urgent, normal 0: the pool host's integer priority, on the scale of a
    model's configured priority class) both derive from it.
    """

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """Place in serving order: 0 is served first."""
        return _RANKS[self]

    @property
    def weight(self) -> int:
        """Urgency as a number that grows with it: high 1, normal 0, low -1."""
        return _RANKS[Priority.NORMAL] - _RANKS[self]

    @classmethod
    def parse(cls, value: str | None) -> Priority:
        """The header's value; anything unknown counts as normal (it is a hint, not a contract)."""
        try:
            return cls((value or cls.NORMAL).strip().lower())
        except ValueError:
            return cls.NORMAL


_RANKS: Final = {priority: rank for rank, priority in enumerate(Priority)}


class Operation(enum.StrEnum):
    """A lifecycle call's ``operation``, as its ``verifiedOpToken`` names it."""

    MODEL_LOAD = "model-load"
    MODEL_UNLOAD = "model-unload"
    CACHE_FLUSH = "cache-flush"


class FlushScope(enum.StrEnum):
    """``scope`` of ``POST /v1/cache/flush``."""

    ALL = "all"
    MODEL = "model"
    TENANT = "tenant"
    TAG = "tag"


class ErrorCode(enum.StrEnum):
    """The spec's ``error.code`` of a refused inference request."""

    QUEUE_FULL = "queue_full"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"


class DeadlineCode(enum.StrEnum):
    """``code`` of a model pool's problem+json refusing a start for its ``X-Conduit-Deadline``:
    not a refusal to offer again later, the time it had is (or will be) gone."""

    UNMEETABLE = "deadline_unmeetable"
    """``422``: its load and run take longer than the time left (refused at once)."""
    EXCEEDED = "deadline_exceeded"
    """``504``: the time ran out while it waited (queue, eviction or load)."""


class PoolCode(enum.StrEnum):
    """``code`` of a model pool host's other problem+json refusals of a start (beside
    :class:`ErrorCode` and :class:`DeadlineCode`)."""

    MODEL_TOO_LARGE = "model_too_large"
    """``422``: the model's memory can never fit the host's budget; final for that host."""
    LOAD_FAILED = "load_failed"
    """``503``: the load the start waited for failed."""
    COOLDOWN = "cooldown"
    """``503``: the model's last load failed; not tried again before ``Retry-After``."""
    UNKNOWN_MODEL = "unknown_model"
    """``404``: the host serves no such model."""


class RunnerStatus(enum.StrEnum):
    """A prediction's status as a runner reports it."""

    STARTING = "starting"
    PROCESSING = "processing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({RunnerStatus.SUCCEEDED, RunnerStatus.FAILED, RunnerStatus.CANCELED})


class WebhookEvent(enum.StrEnum):
    START = "start"
    OUTPUT = "output"
    LOGS = "logs"
    COMPLETED = "completed"


ALL_WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = tuple(WebhookEvent)


class HealthStatus(enum.StrEnum):
    """Values of ``status`` in ``GET /health-check`` (coglet's set)."""

    UNKNOWN = "UNKNOWN"
    STARTING = "STARTING"
    READY = "READY"
    BUSY = "BUSY"
    SETUP_FAILED = "SETUP_FAILED"
    DEFUNCT = "DEFUNCT"
    UNHEALTHY = "UNHEALTHY"


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


class RunnerHealth(enum.StrEnum):
    """``health`` of the capabilities document and ``status`` of ``GET /health``."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


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
