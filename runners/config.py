"""Runner settings, read once when the app is built.

Names follow what runners are configured with elsewhere: coglet's
(``COG_THROTTLE_RESPONSE_INTERVAL``, ``WEBHOOK_AUTH_TOKEN``), the control plane's
(``MAX_QUEUE_DEPTH``), and ``CONDUIT_RUNNER_*`` for the rest. Per-tenant rate limits
(``TENANT_RATE_LIMIT_<tenant>``) and operation-token governance
(``VERIFIED_OP_TOKEN_KEY_PATH``, ``OP_TOKEN_SIGNERS``, ``OP_TOKEN_MIN_SIGNERS``) are read by
:mod:`runners.ratelimit` and :mod:`runners.optokens`, which own their formats.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class RunnerConfig(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    throttle_interval: float = Field(
        0.5, validation_alias=_env("throttle_interval", "COG_THROTTLE_RESPONSE_INTERVAL")
    )
    """Minimum seconds between ``logs`` webhooks."""
    webhook_auth_token: str | None = Field(
        None, validation_alias=_env("webhook_auth_token", "WEBHOOK_AUTH_TOKEN")
    )
    """Sent as ``Authorization: Bearer`` on every webhook."""
    webhook_max_retries: int = 12
    webhook_backoff_base: float = 0.1
    """The terminal webhook's n-th retry waits ``base * 2**min(n, 10)`` seconds."""
    webhook_timeout: float = 30.0
    shutdown_grace: float = Field(
        5.0, validation_alias=_env("shutdown_grace", "CONDUIT_RUNNER_SHUTDOWN_GRACE")
    )
    """Seconds in-flight predictions get to finish on shutdown before they are canceled."""
    max_queue_depth: int = Field(
        16, ge=0, validation_alias=_env("max_queue_depth", "MAX_QUEUE_DEPTH")
    )
    """Predictions that may wait for a slot; beyond it, 503 + ``Retry-After``. 0 = Cog's
    behaviour: no queue, 409 when every slot is busy."""
    runner_id: str | None = Field(None, validation_alias=_env("runner_id", "CONDUIT_RUNNER_ID"))
    """Reported in capabilities; defaults to ``<hostname>:<pid>``."""
    cache_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        validation_alias=_env("cache_max_bytes", "CONDUIT_RUNNER_CACHE_MAX_BYTES"),
    )
    capabilities_ttl: float = Field(
        5.0,
        ge=0,
        le=5,
        validation_alias=_env("capabilities_ttl", "CONDUIT_RUNNER_CAPABILITIES_TTL"),
    )
    """How long ``GET /v1/capabilities`` may serve a computed document (at most 5 s)."""
    min_free_memory: int = Field(
        256 * 1024 * 1024,
        ge=0,
        validation_alias=_env("min_free_memory", "CONDUIT_RUNNER_MIN_FREE_MEMORY"),
    )
    """Bytes of available system (or device) memory below which ``/health`` reports OOM."""
    memory_limit: int | None = Field(
        None, validation_alias=_env("memory_limit", "CONDUIT_RUNNER_MEMORY_LIMIT")
    )
    """Optional cap on the process's RSS in bytes; above it ``/health`` reports OOM."""
    access_log: bool = Field(
        False, validation_alias=_env("access_log", "CONDUIT_RUNNER_ACCESS_LOG")
    )
    """Log every request at INFO. Off by default: the runner sees each prediction at least
    twice, and formatting those lines cost a measurable share of its CPU."""

    @classmethod
    def from_env(cls) -> RunnerConfig:
        return cls()
