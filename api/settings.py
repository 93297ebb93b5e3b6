"""API settings, from ``CONDUIT_API_*``, ``DATABASE_URL`` and ``REDIS_URL``; the synchronous
lane's are its own (``lane.settings``)."""

from __future__ import annotations

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tracker.rate_limits import parse_limit


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONDUIT_API_", extra="ignore", env_ignore_empty=True
    )

    #: The Postgres database (the primary).
    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/conduit",
        validation_alias=AliasChoices("DATABASE_URL", "CONDUIT_DATABASE_URL"),
    )
    #: The Redis of queues and events: one server, a master behind Sentinel, or a Cluster
    #: (``redis+sentinel://``, ``redis+cluster://``).
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", validation_alias=AliasChoices("REDIS_URL", "CONDUIT_REDIS_URL")
    )
    #: A read replica for reading predictions (get, list) and usage; unset: the primary. A
    #: prediction not on the replica yet is read from the primary, so a fresh one is found.
    database_read_url: str | None = Field(
        None,
        validation_alias=AliasChoices("CONDUIT_DATABASE_READ_URL", "CONDUIT_API_DATABASE_READ_URL"),
    )
    #: Where the gateway's request log is, when not in this database (``/logs/...``).
    log_database_url: str | None = Field(
        None,
        validation_alias=AliasChoices(
            "CONDUIT_GATEWAY_LOG_DATABASE_URL", "CONDUIT_API_LOG_DATABASE_URL"
        ),
    )
    #: Absolute base of the URLs the API hands out (``urls.get``, pagination cursors). Derived
    #: from each request's Host when unset; set it behind a proxy.
    public_url: str | None = Field(
        None, validation_alias=AliasChoices("CONDUIT_API_PUBLIC_URL", "CONDUIT_PUBLIC_URL")
    )
    #: Seconds a finished prediction's event stream is kept for SSE replay.
    events_retention: int = 3600
    #: Seconds between SSE heartbeat comments on an idle stream.
    sse_ping: int = 15
    #: Largest accepted request body, in bytes; larger ones get 413.
    max_body_bytes: int = 10 * 1024 * 1024
    #: Seconds that tokens, models, versions and deployments are cached in each process.
    cache_ttl: float = 5.0
    #: Unknown tokens remembered (each for ``cache_ttl``), apart from the valid ones: a flood
    #: of made-up tokens evicts only its own kind.
    unknown_tokens_cached: int = Field(10_000, ge=1)
    #: Failed authentications a client address may make per minute, after a burst of
    #: ``auth_failure_burst``; past that, tokens this process has not already verified get
    #: 429 without a database query. Per api process; IPv6 addresses count per /64.
    auth_failures_per_minute: float = Field(20.0, gt=0)
    auth_failure_burst: int = Field(20, ge=1)
    #: Comma-separated addresses or networks of reverse proxies whose ``X-Forwarded-For`` names
    #: the client (e.g. ``127.0.0.1`` or ``10.0.0.0/8``). Empty: the peer of the connection is
    #: the client, and ``X-Forwarded-For`` is ignored.
    trusted_proxies: str = ""
    #: Items per page of a list (predictions, files, models, ...).
    page_size: int = Field(100, ge=1, le=1000)
    #: Postgres connections kept per process; as many again open as overflow under load.
    db_pool_size: int = 10
    #: Redis connections for commands, per process; a command waits for a free one. Waiters
    #: (``Prefer: wait``, SSE) hold none: one more connection reads events for all of them.
    redis_pool_size: int = Field(32, ge=1)
    #: Most ``Prefer: wait`` and SSE waiters per process; past it ``Prefer: wait`` answers at
    #: once with the prediction ``starting`` (never an error).
    max_waiters: int = Field(10_000, ge=0)
    #: Most of those one account may hold (unset: half of ``max_waiters``, rounded up, as the
    #: ``/run`` lane shares its queue); past it that account's ``Prefer: wait`` answers at once
    #: and its SSE gets 503, while other accounts still wait.
    max_waiters_per_account: int | None = Field(None, ge=0)
    #: Most one prediction may hold (unset: half its account's share): a leaked stream URL
    #: costs its account no more than this.
    max_waiters_per_prediction: int | None = Field(None, ge=0)
    #: Longest block, in milliseconds, of the process's one event read: bounds how late a
    #: waiter that joins during a read is served when its wake-up misses that read.
    events_block_ms: int = Field(250, ge=10)
    #: On ``Prefer: wait`` responses of finished predictions, also report the runner's time
    #: (``X-Remote-Processing-Time``, and per run ``X-Remote-Processing-Times``).
    remote_time_forwarding: bool = Field(
        False,
        validation_alias=AliasChoices(
            "CONDUIT_REMOTE_TIME_FORWARDING", "CONDUIT_API_REMOTE_TIME_FORWARDING"
        ),
    )
    #: Predictions one account may create (every create route and ``/run``), shared by every
    #: api replica (counted in Redis): ``600req/min``, ``10/s``…; ``off``: no limit. Past it:
    #: 429 ``rate_limited`` with ``Retry-After``.
    create_rate_limit: str = "600req/min"
    #: Creates an account may make at once before the rate applies (unset: the limit's count).
    create_rate_burst: int | None = Field(None, ge=1)

    # The operator page (``/ops``, ``api.ops``).
    #: Input fields shown as ``[redacted]`` wherever ``/ops`` shows an input, at any depth,
    #: matched case-insensitively by name (comma-separated).
    ops_redact: str = "password,passwd,secret,token,api_key,apikey,authorization,private_key"
    #: Seconds an operator's sign-in lasts without use.
    ops_session_ttl: int = Field(8 * 3600, ge=60)
    #: Seconds between the pages' refreshes (the operator may pause them); 2 at the least.
    ops_poll_seconds: float = Field(5.0, ge=2.0)
    #: The directors' visibility timeout, for the verdicts of "why is this waiting?"
    #: (``CONDUIT_DIRECTOR_VISIBILITY_TIMEOUT``; the page tells when a held entry is reclaimed).
    ops_visibility_timeout: float = Field(
        60.0,
        gt=0,
        validation_alias=AliasChoices(
            "CONDUIT_DIRECTOR_VISIBILITY_TIMEOUT", "CONDUIT_API_OPS_VISIBILITY_TIMEOUT"
        ),
    )

    @field_validator("create_rate_limit")
    @classmethod
    def _rate(cls, value: str) -> str:
        parse_limit(value)  # a ValueError names what is wrong
        return value

    # Connections (api.connections): what one client connection may hold, and for how long.
    #: Seconds a request's head may take, from the connection's opening or its first byte.
    head_timeout: float = Field(10.0, gt=0)
    #: Longest request head (request line and headers), in bytes; longer gets 431.
    max_head_bytes: int = Field(64 * 1024, ge=1024)
    #: Most header fields in a request; more gets 431.
    max_headers: int = Field(100, ge=1)
    #: Seconds of each window in which a request body must bring ``body_min_rate`` bytes a
    #: second; a body that stalls or drips is ended (408).
    body_timeout: float = Field(20.0, gt=0)
    body_min_rate: float = Field(256.0, ge=0)
    #: Seconds a connection may leave its answers unread before it is dropped.
    send_timeout: float = Field(60.0, gt=0)
    #: Seconds an idle connection is kept open after an answer. Longer than the idle expiry of
    #: clients' pools (httpx and others: 5 s) and load balancers (60 s), so the client, not the
    #: server, ends an idle connection: a server closing it as a client reuses it loses that
    #: request ("server disconnected without sending a response").
    keep_alive_timeout: int = Field(65, gt=0)
    #: Most connections open at once, and from one client address (IPv6: per /64; trusted
    #: proxies count only towards the first); past either, 503 and the connection is closed.
    max_connections: int = Field(8192, ge=1)
    max_connections_per_address: int = Field(1024, ge=1)
    #: Requests a connection may send ahead of the answer it is waiting for; past them the
    #: api stops reading the connection until answers go out.
    max_pipelined: int = Field(16, ge=1)

    # Operations: shutdown, metrics.
    #: Seconds open requests get to end after SIGTERM before the server closes them. Longer
    #: than the longest ``Prefer: wait`` (``api.prefer.MAX_WAIT``, 60 s), although waiters are
    #: answered as soon as SIGTERM arrives; keep it under the orchestrator's grace period.
    shutdown_timeout: int = Field(65, ge=1)
    #: Serve ``/metrics`` on this port of its own (on ``metrics_host``) instead of the API's
    #: port, so that what is public of the API need not include it. Unset: the API's port.
    metrics_port: int | None = Field(None, ge=0, le=65535)
    #: Address of the ``metrics_port`` listener; ``0.0.0.0`` for Prometheus in another pod.
    metrics_host: str = "127.0.0.1"
