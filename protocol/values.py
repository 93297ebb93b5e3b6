"""The runner contract's enumerated values: priorities, statuses, webhook events, the control
API's operations and the codes of its refusals."""

from __future__ import annotations

import enum
from typing import Final


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


class RunnerHealth(enum.StrEnum):
    """``health`` of the capabilities document and ``status`` of ``GET /health``."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
