"""Runner settings, read once when the app is built.

Names follow what runners are configured with elsewhere: coglet's
(``COG_THROTTLE_RESPONSE_INTERVAL``, ``WEBHOOK_AUTH_TOKEN``), the control plane's
(``MAX_QUEUE_DEPTH``), and ``CONDUIT_RUNNER_*`` for the rest (``CONDUIT_RUNNER_TOKEN`` is the
one secret a runner and its directors share). Per-tenant rate limits
(``TENANT_RATE_LIMIT_<tenant>``) and operation-token governance
(``VERIFIED_OP_TOKEN_KEY_PATH``, ``OP_TOKEN_SIGNERS``, ``OP_TOKEN_MIN_SIGNERS``) are read by
:mod:`runners.ratelimit` and :mod:`runners.optokens`, which own their formats.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from core.ssrf import Network, normalise_hosts

MIN_TOKEN_CHARS = 16
"""A shorter runner token is refused: it would be guessable, or a placeholder."""


class _NamedEnv(EnvSettingsSource):
    """The environment, read only by each setting's documented name: a setting with an alias
    (``CONDUIT_RUNNER_TOKEN``) is not also read by its bare field name (``TOKEN``), which
    ``populate_by_name`` would otherwise let the environment set too: a shell holding the
    api's ``TOKEN`` would hand it to a runner as its runner token."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value, key, complex_ = super().get_field_value(field, field_name)
        alias = field.validation_alias
        if isinstance(alias, str) and key.lower() != alias.lower():
            return None, key, complex_  # found by its field name only: not a setting
        return value, key, complex_


class RunnerConfig(BaseSettings):
    # hide_input_in_errors: a refused setting is reported without its value (it may be a secret).
    # populate_by_name: code and tests build one by field name (``RunnerConfig(token=...)``);
    # the environment is read by the documented names alone (``_NamedEnv``).
    model_config = SettingsConfigDict(
        frozen=True,
        populate_by_name=True,
        extra="ignore",
        hide_input_in_errors=True,
        env_ignore_empty=True,
    )
    #: Read by ``conduit.settings_catalog``: the environment names a field by its alias alone.
    ENV_BY_ALIAS_ONLY: ClassVar[bool] = True

    throttle_interval: float = Field(0.5, validation_alias="COG_THROTTLE_RESPONSE_INTERVAL")
    """Minimum seconds between ``logs`` webhooks."""
    token: str | None = Field(None, repr=False, validation_alias="CONDUIT_RUNNER_TOKEN")
    """The shared secret every request but the health checks must carry as
    ``Authorization: Bearer``. Without one, the runner serves whoever reaches it (it listens
    on loopback unless told otherwise) and refuses shutdown, cancel and attach (unless
    ``trust_loopback``)."""
    trust_loopback: bool = Field(False, validation_alias="CONDUIT_RUNNER_TRUST_LOOPBACK")
    """Without a token, take shutdown, cancel and attach from loopback peers. Off by default:
    loopback is no credential where a webhook sender on the host can reach it."""
    webhook_auth_token: str | None = Field(None, repr=False, validation_alias="WEBHOOK_AUTH_TOKEN")
    """Sent as ``Authorization: Bearer`` on every webhook, as coglet sends it: the credential
    a webhook receiver may ask of the runner. Never the same value as ``token``."""
    webhook_allow: str = Field(
        "127.0.0.0/8,::1/128",
        validation_alias="CONDUIT_RUNNER_WEBHOOK_ALLOW",
    )
    """Comma-separated networks (CIDRs) and host names webhooks may reach although the SSRF
    guard refuses internal addresses: loopback by default, where a runner's director sits; in
    a container network, the director's service name."""
    webhook_max_retries: int = 12
    """Retries of the terminal webhook after its first try."""
    webhook_backoff_base: float = 0.1
    """The terminal webhook's n-th retry waits ``base * 2**min(n, 10)`` seconds."""
    webhook_timeout: float = 30.0
    """Seconds one webhook delivery may take in all."""
    webhook_connect_timeout: float = Field(
        3.0,
        gt=0,
        validation_alias="CONDUIT_RUNNER_WEBHOOK_CONNECT_TIMEOUT",
    )
    """Seconds to connect to a webhook receiver; one that does not answer must not hold a
    delivery for the whole ``webhook_timeout``."""
    redis_url: str | None = Field(None, repr=False, validation_alias="CONDUIT_RUNNER_REDIS_URL")
    """``redis://`` or ``rediss://``: where operation-token nonces are recorded, so replicas
    and restarts share replay protection. Without it they live in this process's memory."""
    shutdown_grace: float = Field(5.0, validation_alias="CONDUIT_RUNNER_SHUTDOWN_GRACE")
    """Seconds in-flight predictions get to finish on shutdown before they are canceled."""
    max_queue_depth: int = Field(16, ge=0, validation_alias="MAX_QUEUE_DEPTH")
    """Predictions that may wait for a slot; beyond it, 503 + ``Retry-After``. 0 = Cog's
    behaviour: no queue, 409 when every slot is busy."""
    runner_id: str | None = Field(None, validation_alias="CONDUIT_RUNNER_ID")
    """Reported in capabilities; defaults to ``<hostname>:<pid>``."""
    cache_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        validation_alias="CONDUIT_RUNNER_CACHE_MAX_BYTES",
    )
    """Bytes of answers the runner's result cache holds at most."""
    capabilities_ttl: float = Field(
        5.0,
        ge=0,
        le=5,
        validation_alias="CONDUIT_RUNNER_CAPABILITIES_TTL",
    )
    """How long ``GET /v1/capabilities`` may serve a computed document (at most 5 s)."""
    min_free_memory: int = Field(
        256 * 1024 * 1024,
        ge=0,
        validation_alias="CONDUIT_RUNNER_MIN_FREE_MEMORY",
    )
    """Bytes of available system (or device) memory below which ``/health`` reports OOM."""
    memory_limit: int | None = Field(None, validation_alias="CONDUIT_RUNNER_MEMORY_LIMIT")
    """Optional cap on the process's RSS in bytes; above it ``/health`` reports OOM."""
    file_max_bytes: int = Field(
        100 * 1024 * 1024,
        gt=0,
        validation_alias="CONDUIT_RUNNER_FILE_MAX_BYTES",
    )
    """Largest file input a prediction downloads (or decodes from a data URL), in bytes."""
    file_read_timeout: float = Field(
        60.0,
        gt=0,
        validation_alias="CONDUIT_RUNNER_FILE_READ_TIMEOUT",
    )
    """Seconds a file download or output upload may wait for its peer between reads; a whole
    transfer has no limit of its own (a large file on a slow link is not a fault)."""
    access_log: bool = Field(False, validation_alias="CONDUIT_RUNNER_ACCESS_LOG")
    """Log every request at INFO. Off by default: the runner sees each prediction at least
    twice, and formatting those lines cost a measurable share of its CPU."""

    @field_validator("token", "webhook_auth_token", "redis_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("token")
    @classmethod
    def _strong_token(cls, value: str | None) -> str | None:
        if value is not None and len(value) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"CONDUIT_RUNNER_TOKEN must be at least {MIN_TOKEN_CHARS} characters "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value

    @model_validator(mode="after")
    def _tokens_differ(self) -> RunnerConfig:
        # WEBHOOK_AUTH_TOKEN goes to every webhook URL a caller names: were it the runner
        # token, any receiver would learn the key to the runner.
        if self.token is not None and self.webhook_auth_token == self.token:
            raise ValueError("WEBHOOK_AUTH_TOKEN must not be the runner's CONDUIT_RUNNER_TOKEN")
        return self

    @field_validator("webhook_allow")
    @classmethod
    def _readable_allow(cls, value: str) -> str:
        _split_allow(value)
        return value

    def webhook_networks(self) -> tuple[Network, ...]:
        """The networks of ``webhook_allow`` (a bare address counts as a single host)."""
        return _split_allow(self.webhook_allow)[0]

    def webhook_hosts(self) -> frozenset[str]:
        """The host names of ``webhook_allow``."""
        return _split_allow(self.webhook_allow)[1]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _NamedEnv(settings_cls))

    @classmethod
    def from_env(cls) -> RunnerConfig:
        return cls()


_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?\.?")


@functools.lru_cache(maxsize=16)
def _split_allow(value: str) -> tuple[tuple[Network, ...], frozenset[str]]:
    """``webhook_allow`` read as (networks, host names); raises ValueError on an item that is
    neither. Remembered: every prediction's webhook and file guards ask for it, and parsing
    the networks again cost a tenth of a no-op prediction's runner CPU."""
    networks: list[Network] = []
    hosts: list[str] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            if "/" in item or ":" in item or not _HOST_NAME.fullmatch(item):
                message = f"webhook allow: {item!r} is neither a network nor a host name"
                raise ValueError(message) from None
            hosts.append(item)
    return tuple(networks), normalise_hosts(hosts)
