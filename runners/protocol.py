"""Cog's HTTP wire protocol, as pydantic models.

This module is the only contract between a director and a runner: the director imports it
and nothing else from ``runners``. It describes what coglet 0.23.1 sends and accepts (see the
reference notes): a runner's webhook and terminal payloads carry only ``id``, ``status``,
``logs``, ``output``, ``error`` and ``metrics`` -- never ``input`` or timestamps, which the
platform fills in itself.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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

    @property
    def accepts_work(self) -> bool:
        return self in (HealthStatus.READY, HealthStatus.BUSY)


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
