"""Gateway settings, from ``CONDUIT_GATEWAY_*``, ``DATABASE_URL`` and ``REDIS_URL`` (read as the
api reads them)."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MIB = 1024 * 1024


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONDUIT_GATEWAY_", extra="ignore", env_ignore_empty=True
    )

    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/conduit",
        validation_alias=AliasChoices("DATABASE_URL", "CONDUIT_DATABASE_URL"),
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", validation_alias=AliasChoices("REDIS_URL", "CONDUIT_REDIS_URL")
    )
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535)
    #: Largest message received or sent, in bytes. gRPC's own default (4 MiB) refuses the
    #: files real tasks carry; a larger request is refused with RESOURCE_EXHAUSTED.
    max_message_bytes: int = Field(64 * MIB, ge=1024)
    #: Seconds a task may take when its call carries no deadline of its own.
    default_deadline: float = Field(600.0, gt=0)
    #: Seconds a session (``session_id``) is remembered after its last task.
    session_ttl: int = Field(86400, ge=1)
    #: Seconds a token's account (or its absence) is remembered in each process.
    token_cache_ttl: float = Field(5.0, ge=0)
    #: Tokens remembered at most (valid and unknown together); the oldest go first.
    tokens_cached: int = Field(10_000, ge=1)
    db_pool_size: int = Field(10, ge=1)
    #: Seconds calls under way get to finish after SIGTERM before they are cancelled.
    shutdown_grace: float = Field(30.0, ge=0)
