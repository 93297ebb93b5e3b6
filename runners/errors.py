"""Errors the runner service raises to its HTTP shell.

::

    RunnerError
    ├── NotReadyError         setup has not finished, or failed          -> 503
    │   └── ModelNotLoadedError  the model was unloaded                  -> 503 + Retry-After
    ├── AtCapacityError       every slot is in use and there is no queue -> 409
    ├── QueueFullError        the bounded queue is full                  -> 503 + Retry-After
    ├── RateLimitedError      the tenant used up its rate limit          -> 429 + Retry-After
    ├── InputValidationError  the input does not match the Input schema  -> 422
    ├── UnknownModelError     a control call names a model not served    -> 404
    └── LifecycleConflictError  load/unload now would break something    -> 409
        └── CacheBusyError      the model refuses to drop its caches now  -> 409

A model that raises while predicting is none of these: that is a prediction failure, kept as
data (status ``failed`` with ``error``), not an exception that crosses this boundary.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ValidationIssue:
    """One entry of a 422 ``detail`` list: ``loc`` is ``["body", "input", field]``."""

    field: str
    msg: str
    type: str = "value_error"


class RunnerError(Exception):
    """Base class: a request the runner refuses before any model code runs."""


class NotReadyError(RunnerError):
    """Raised when a prediction arrives while setup is running or after it failed."""

    def __init__(self) -> None:
        super().__init__(
            "Setup has not finished yet. Wait until it has finished, "
            "or GET /health-check for status."
        )


class AtCapacityError(RunnerError):
    """Raised when every prediction slot is busy; the runner never queues."""

    def __init__(self) -> None:
        super().__init__("At capacity - all prediction slots busy")


class ModelNotLoadedError(NotReadyError):
    """Raised when a prediction arrives while the model is unloaded (or being loaded)."""

    def __init__(self, model: str) -> None:
        message = f"Model {model} is not loaded; load it with POST /v1/models/load"
        RunnerError.__init__(self, message)


class QueueFullError(RunnerError):
    """Raised when the bounded prediction queue has no room."""

    def __init__(self, depth: int, retry_after: int) -> None:
        super().__init__(f"Prediction queue is full ({depth} waiting); retry after {retry_after}s")
        self.depth = depth
        self.retry_after = retry_after


@dataclass(frozen=True)
class RateLimit:
    """Where a tenant stands against its limit (for 429 bodies and headers)."""

    limit: int
    remaining: int
    window: float
    reset_at: float
    """Unix time at which the oldest counted request leaves the window."""
    retry_after: int


class RateLimitedError(RunnerError):
    """Raised when a tenant has used up its requests for the current window."""

    def __init__(self, tenant: str, state: RateLimit) -> None:
        super().__init__(
            f"Tenant {tenant} exceeded {state.limit} requests per {state.window:g}s; "
            f"retry after {state.retry_after}s"
        )
        self.tenant = tenant
        self.state = state


class UnknownModelError(RunnerError):
    """Raised when a control call names a model this runner does not serve."""

    def __init__(self, model: str, served: str) -> None:
        super().__init__(f"This runner serves {served!r}, not {model!r}")


class LifecycleConflictError(RunnerError):
    """Raised when a load or unload cannot happen now (e.g. predictions are running)."""


class InputValidationError(RunnerError):
    """Raised when the input fails validation against ``components.schemas.Input``."""

    def __init__(self, issues: list[ValidationIssue]) -> None:
        super().__init__("; ".join(f"{issue.field}: {issue.msg}" for issue in issues))
        self.issues = issues


class CacheBusyError(LifecycleConflictError):
    """Raised when a model refuses to drop its own caches now (an LLM engine with requests
    running keeps its prefix cache)."""
