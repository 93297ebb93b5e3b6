"""The root of the refusals a runner answers with, and the refusals of a request it cannot
serve now (not ready, at capacity, queue full, rate limited, a model pool's refusals).

Every class of the tree is a request the runner refuses before any model code runs. The class
says how it is answered -- ``status``, ``code`` (the problem's machine-readable name), ``title``,
and ``reason`` (its label in the requests metric) -- so the HTTP shell renders any of them with
one function (:func:`runners.problems.refusal`) and no table keyed by type::

    RequestRefused                 (abstract)                                      status code
    ├── UnauthorizedError          no or another runner token           401 unauthorized
    ├── InternalOnlyError          shutdown, cancel or attach without the runner token,
    │                              from a peer loopback trust does not cover  403 internal-only
    ├── UnsupportedEncodingError   a body sent with Content-Encoding
    │                                                   415 unsupported-content-encoding
    ├── NotReadyError              setup has not finished, or failed             503 (Cog body)
    │   └── ModelNotLoadedError    the model was unloaded          503 + Retry-After (Cog body)
    ├── AtCapacityError            every slot is in use and there is no queue    409 (Cog body)
    ├── InputValidationError       the input does not match the Input schema  422 (FastAPI body)
    ├── WebhookRefusedError        the webhook is an address the SSRF guard refuses
    │                                                                        422 (FastAPI body)
    ├── QueueFullError             the bounded queue is full    503 + Retry-After  queue_full
    ├── RateLimitedError           the tenant used up its limit 429 + Retry-After
    │                                                                     rate_limit_exceeded
    ├── NotRunningError            an attach (If-Match: *) for a prediction not here  412
    │                                                                             not-running
    ├── PoolRefusal                a model pool cannot start a prediction of the model now
    │   ├── CooldownError          its last load failed, not retried yet  503 + Retry-After
    │   │                                                                          cooldown
    │   ├── LoadFailedError        the load it waited for failed  503 (+ Retry-After) load_failed
    │   ├── ModelTooLargeError     it can never fit the pool's memory    422 model_too_large
    │   ├── DeadlineUnmeetableError  its load and run outlast its deadline
    │   │                                                           422 deadline_unmeetable
    │   ├── DeadlineExceededError  its deadline passed while it waited 504 deadline_exceeded
    │   └── UnknownSlotError       the pool serves no such model           404 unknown_model
    ├── BackendUnreachableError    a pool's model server did not answer
    │                                                                 502 backend-unreachable
    └── (the refusals of control calls: :mod:`runners.control_errors`)

The refusals of a request as it was sent -- its token (401, 403) and its body (415, 422) --
are in :mod:`runners.request_errors`; the rest are here.

Cog's own refusals keep coglet's bodies, so a Cog client sees what it knows. The others are
RFC 9457 problem+json; the two the runner API spec names (queue full, rate limit) also carry
the spec's ``error`` member, and their ``code`` is the spec's.

A model that raises while predicting is none of these: that is a prediction failure, kept as
data (status ``failed`` with ``error``), not an exception that crosses this boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.documents import QueueFullDetail, RateLimitDetail
from protocol.headers import (
    JSON,
    PROBLEM_JSON,
    RATE_LIMIT_LIMIT,
    RATE_LIMIT_REMAINING,
    RATE_LIMIT_RESET,
    RETRY_AFTER,
)
from protocol.values import DeadlineCode, ErrorCode, RunnerStatus


class RequestRefused(Exception):
    """Base class: a request the runner refuses, answered with ``status`` and ``code``."""

    status: ClassVar[int] = 400
    code: ClassVar[str] = "refused"
    title: ClassVar[str] = "Bad Request"
    #: Label of a refused prediction request in ``conduit_runner_requests``.
    reason: ClassVar[str] = "refused"
    media_type: ClassVar[str] = PROBLEM_JSON
    #: Seconds to suggest in ``Retry-After``; None sends no such header.
    retry_after: int | None = None

    def members(self) -> dict[str, Any]:
        """Members of the problem body beyond type, title, status, detail and code."""
        return {}

    def body(self) -> dict[str, Any]:
        problem = {"type": "about:blank", "title": self.title, "status": self.status}
        return problem | {"detail": str(self), "code": self.code, **self.members()}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {RETRY_AFTER: str(self.retry_after)}


class _CogRefusal(RequestRefused):
    """Answered as coglet answers it: ``{"error": <message>, "status": "failed"}``."""

    media_type = JSON
    reason = "not_ready"

    def body(self) -> dict[str, Any]:
        return {"error": str(self), "status": RunnerStatus.FAILED.value}


class NotReadyError(_CogRefusal):
    """Raised when a prediction arrives while setup is running or after it failed."""

    status = 503
    code = "not-ready"

    def __init__(self) -> None:
        super().__init__(
            "Setup has not finished yet. Wait until it has finished, "
            "or GET /health-check for status."
        )


class ModelNotLoadedError(NotReadyError):
    """Raised when a prediction arrives while the model is unloaded (or being loaded)."""

    code = "model-not-loaded"
    retry_after = 5

    def __init__(self, model: str) -> None:
        message = f"Model {model} is not loaded; load it with POST /v1/models/load"
        RequestRefused.__init__(self, message)


class AtCapacityError(_CogRefusal):
    """Raised when every prediction slot is busy; the runner never queues."""

    status = 409
    code = "busy"
    reason = "busy"

    def __init__(self) -> None:
        super().__init__("At capacity - all prediction slots busy")


class QueueFullError(RequestRefused):
    """Raised when the bounded prediction queue has no room (depth >= maxDepth)."""

    status = 503
    code = ErrorCode.QUEUE_FULL
    title = "Runner queue is full"
    reason = "queue_full"

    def __init__(self, depth: int, max_depth: int, avg_wait_ms: float, retry_after: int) -> None:
        super().__init__(f"Queue depth {depth}/{max_depth}, retry in {retry_after} seconds")
        self.depth = depth
        self.max_depth = max_depth
        self.avg_wait_ms = avg_wait_ms
        self.retry_after = retry_after

    def members(self) -> dict[str, Any]:
        error = QueueFullDetail(
            message=str(self), queue_depth=self.depth, avg_wait_ms=round(self.avg_wait_ms)
        )
        return {"error": error.wire()}


@dataclass(frozen=True)
class RateLimit:
    """Where a tenant stands against its limit (for 429 bodies and headers)."""

    limit: int
    remaining: int
    window: float
    reset_at: float
    """Unix time at which the oldest counted request leaves the window."""
    retry_after: int

    def headers(self) -> dict[str, str]:
        return {
            RATE_LIMIT_LIMIT: str(self.limit),
            RATE_LIMIT_REMAINING: str(self.remaining),
            RATE_LIMIT_RESET: str(math.ceil(self.reset_at)),
        }


class RateLimitedError(RequestRefused):
    """Raised when a tenant has used up its requests for the current window."""

    status = 429
    code = ErrorCode.RATE_LIMIT_EXCEEDED
    title = "Too many requests for this tenant"
    reason = "rate_limited"

    def __init__(self, tenant: str, state: RateLimit) -> None:
        super().__init__(
            f"Tenant {tenant} exceeded {state.limit} requests per {state.window:g}s; "
            f"retry after {state.retry_after}s"
        )
        self.tenant = tenant
        self.state = state
        self.retry_after = state.retry_after

    def members(self) -> dict[str, Any]:
        state = self.state
        error = RateLimitDetail(
            message=str(self),
            limit=state.limit,
            remaining=state.remaining,
            reset_at=math.ceil(state.reset_at),
        )
        return {"tenant": self.tenant, "error": error.wire()}

    def headers(self) -> dict[str, str]:
        return super().headers() | self.state.headers()


class NotRunningError(RequestRefused):
    """Raised when an attach (``If-Match: *``) names a prediction not running here."""

    status = 412
    code = "not-running"
    title = "Prediction is not running here"

    def __init__(self, prediction_id: str) -> None:
        super().__init__(f"prediction {prediction_id} is not running on this runner")


class PoolRefusal(RequestRefused):
    """Base: a model pool refuses to start a prediction of ``model`` (its ``code`` is the pool
    core's reason, :class:`runners.pool.events.RejectCode`)."""

    title = "The model pool cannot serve this now"

    def __init__(self, model: str, retry_after: float | None, why: str = "") -> None:
        super().__init__(f"model {model}: {self.code}{f' ({why})' if why else ''}")
        self.model = model
        if retry_after is not None:
            self.retry_after = max(1, math.ceil(retry_after))

    def members(self) -> dict[str, Any]:
        return {"field": "model", "model": self.model}


class CooldownError(PoolRefusal):
    """Raised when the model's last load failed and its cooldown has not ended."""

    status, code = 503, "cooldown"


class LoadFailedError(PoolRefusal):
    """Raised when the load the request waited for failed or outlasted its load timeout."""

    status, code = 503, "load_failed"


class ModelTooLargeError(PoolRefusal):
    """Raised when the model's lease can never fit the pool's budget."""

    status, code = 422, "model_too_large"


class DeadlineUnmeetableError(PoolRefusal):
    """Raised before a load when the model's load and run take longer than the time left."""

    status, code = 422, DeadlineCode.UNMEETABLE.value


class DeadlineExceededError(PoolRefusal):
    """Raised when the deadline passed while the request waited (queue, eviction or load)."""

    status, code = 504, DeadlineCode.EXCEEDED.value


class UnknownSlotError(PoolRefusal):
    """Raised when a request names a model the pool does not serve."""

    status, code = 404, "unknown_model"


class BackendUnreachableError(RequestRefused):
    """Raised when a pool's model server (its backend) does not answer, or is not running."""

    status, code, title = 502, "backend-unreachable", "The model's server did not answer"
