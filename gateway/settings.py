"""Gateway settings, from ``CONDUIT_GATEWAY_*``, ``DATABASE_URL`` and ``REDIS_URL`` (read as the
api reads them)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tracker.rate_limits import parse_limit

MIB = 1024 * 1024


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONDUIT_GATEWAY_", extra="ignore", env_ignore_empty=True
    )

    #: The Postgres database, as the api reads it.
    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/conduit",
        validation_alias=AliasChoices("DATABASE_URL", "CONDUIT_DATABASE_URL"),
    )
    #: The Redis of queues and events, as the api reads it.
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", validation_alias=AliasChoices("REDIS_URL", "CONDUIT_REDIS_URL")
    )
    #: Where the gRPC server listens (``--host``, ``--port``).
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535)
    #: Largest message received or sent, in bytes. gRPC's own default (4 MiB) refuses the
    #: files real tasks carry; a larger request is refused with RESOURCE_EXHAUSTED.
    max_message_bytes: int = Field(64 * MIB, ge=1024)

    @property
    def message_options(self) -> list[tuple[str, int]]:
        """gRPC options for ``max_message_bytes`` both ways (the server's and a peer channel's)."""
        limit = self.max_message_bytes
        return [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ]

    #: Concurrent calls (HTTP/2 streams) one connection may have open; more wait for one to
    #: end. gRPC's transport buffers the message of each open stream, so a connection holds at
    #: most this many times ``max_message_bytes`` of messages not yet read.
    max_concurrent_streams: int = Field(32, ge=1)
    #: Bytes of request messages the gateway reads and keeps at once for authenticated calls:
    #: a read reserves ``max_message_bytes`` until the message's size is known, then holds that
    #: size until its call ends; past this, reads wait. (A call is authenticated before any of
    #: its message is read; tokenless methods — health, ``ServerLive``... — read one message
    #: at a time, apart.)
    max_bytes_in_flight: int = Field(256 * MIB, ge=1024)

    @property
    def server_options(self) -> list[tuple[str, int]]:
        """The server's gRPC options: :attr:`message_options`; the streams per connection,
        counted as HTTP/2 counts them (gRPC's "overload protection" also counts streams that
        ended but whose calls Python has not yet let go of, and refuses a client that keeps
        to the limit: ``UNAVAILABLE``); no bandwidth-delay probing: with it, the transport's
        window grows to let megabytes of a call's message arrive before the call is refused
        (a message being read still gets the window its length asks for)."""
        return [
            *self.message_options,
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http.overload_protection", 0),
        ]

    #: Files one task (``files``) may carry, and their bytes in all: past either, the task is
    #: refused (``INVALID_ARGUMENT``, ``RESOURCE_EXHAUSTED``) before any is stored.
    task_max_files: int = Field(64, ge=0)
    task_max_file_bytes: int = Field(64 * MIB, ge=0)

    @field_validator("create_rate_limit")
    @classmethod
    def _rate(cls, value: str) -> str:
        parse_limit(value)  # a ValueError names what is wrong
        return value

    #: Seconds a task may take when its call carries no deadline of its own.
    default_deadline: float = Field(600.0, gt=0)
    #: Seconds a session (``session_id``) is remembered after its last task.
    session_ttl: int = Field(86400, ge=1)
    #: Seconds a session keeps what it resolved (its blocks, its graphs' plans), so that its
    #: later tasks skip resolving them on any replica; a block deleted or a grant revoked
    #: reaches a session at most this late.
    route_ttl: int = Field(300, ge=1)
    #: Largest answer kept for replay; a larger one is not sent twice: its replay is
    #: FAILED_PRECONDITION.
    session_answer_max_bytes: int = Field(16 * MIB, ge=0)
    #: Seconds a token's account (or its absence) is remembered in each process.
    token_cache_ttl: float = Field(5.0, ge=0)
    #: Unknown tokens remembered at most, apart from the valid ones: a flood of made-up tokens
    #: evicts only its own kind.
    tokens_cached: int = Field(10_000, ge=1)
    #: Failed authentications an address may make (a token bucket, per process, as the api's
    #: ``auth_failures_per_minute``/``auth_failure_burst``): past them, tokens this process has
    #: not verified are refused ``RESOURCE_EXHAUSTED`` with ``retry-after``, with no query.
    auth_failures_per_minute: float = Field(20.0, gt=0)
    auth_failure_burst: int = Field(20, ge=1)
    #: Each account's rate of creates: every prediction a task makes counts, a graph's each
    #: (counted together before it runs; one with more than the burst is refused). The same
    #: schedule in Redis as the api's (``CONDUIT_API_CREATE_RATE_LIMIT``, read when this is
    #: unset): an account's creates count the same through either door. ``off``: no limit.
    create_rate_limit: str = Field(
        "600req/min",
        validation_alias=AliasChoices(
            "CONDUIT_GATEWAY_CREATE_RATE_LIMIT", "CONDUIT_API_CREATE_RATE_LIMIT"
        ),
    )
    create_rate_burst: int | None = Field(
        None,
        ge=1,
        validation_alias=AliasChoices(
            "CONDUIT_GATEWAY_CREATE_RATE_BURST", "CONDUIT_API_CREATE_RATE_BURST"
        ),
    )
    #: Postgres connections kept; as many again open as overflow under load.
    db_pool_size: int = Field(10, ge=1)
    #: Seconds calls under way get to finish after SIGTERM before they are cancelled.
    shutdown_grace: float = Field(30.0, ge=0)
    #: Where the api is reached (``CONDUIT_PUBLIC_URL``): the host of the file references a
    #: task's files become in its prediction's input (any host works for the runners, which
    #: get delivery URLs; this one is what a person reading the prediction can follow).
    public_url: str = Field(
        "http://127.0.0.1:8000",
        validation_alias=AliasChoices("CONDUIT_GATEWAY_PUBLIC_URL", "CONDUIT_PUBLIC_URL"),
    )
    #: Redis connections for commands.
    redis_pool_size: int = Field(32, ge=1)
    #: Seconds a block, a deployment or a version is cached once read.
    cache_ttl: float = Field(5.0, ge=0)
    #: Tasks waiting on the durable path at once (each one subscription to the event hub).
    max_waiters: int = Field(10_000, ge=1)
    #: Longest block, in milliseconds, of the event reader's one read.
    events_block_ms: int = Field(250, ge=10)
    #: Seconds a prediction's events are kept after it ends (as the api keeps them).
    events_retention: int = Field(3600, ge=1)
    #: Join the synchronous lane, so blocks marked synchronous run through it (no durable
    #: write). Off by default: a lane member takes a share of every runner's permits from the
    #: api replicas. Without it a synchronous block runs on the durable path.
    lane: bool = False
    #: A graph (``output_ptr``) has at most this many blocks, and a block this many children.
    graph_max_nodes: int = Field(32, ge=1)
    graph_max_fanout: int = Field(32, ge=1)
    #: Steps of one graph run at once, at most.
    graph_max_inflight: int = Field(8, ge=1)
    #: The quota (``gateway.quota``), each limit unset by default: none set, no quota and no
    #: Redis call. Requests per second of the whole gateway (every replica together), of an
    #: account, of a session (``session_id``), of a block (``block_id``); and requests of a
    #: session, of a block, over ``quota_window`` seconds.
    quota_requests_per_second_total: int | None = Field(None, ge=1)
    quota_requests_per_second_per_account: int | None = Field(None, ge=1)
    quota_requests_per_second_per_session: int | None = Field(None, ge=1)
    quota_requests_per_second_per_block_id: int | None = Field(None, ge=1)
    quota_requests_per_session_id: int | None = Field(None, ge=1)
    quota_requests_per_block_id: int | None = Field(None, ge=1)
    quota_window: float = Field(86400.0, gt=0)
    #: Count and report tasks over quota (log, ``conduit_gateway_quota_refusals_total``)
    #: without refusing them: to see what a quota would do before enforcing it.
    quota_shadow: bool = False
    #: This installation's cluster (``CONDUIT_CLUSTER_ID``). Set, the gateway registers itself
    #: in the registry (:mod:`gateway.cluster`), heartbeats, publishes its blocks, and runs
    #: blocks other clusters publish through their gateways. Unset: a gateway of one cluster.
    cluster_id: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        validation_alias=AliasChoices("CONDUIT_GATEWAY_CLUSTER_ID", "CONDUIT_CLUSTER_ID"),
    )
    #: The address other clusters dial this gateway at (``host:port``; the registry's
    #: ``inference_server_public_url``). Default: the address it listens on.
    advertise_url: str | None = None
    #: The registry record's name, metadata (a JSON object: region, provider, …) and tags.
    server_name: str | None = None
    server_metadata: dict[str, Any] = Field(default_factory=dict)
    server_tags: list[str] = Field(default_factory=list)
    #: The database holding the registry every cluster's gateways share. Default: this
    #: cluster's own (then its api serves the registry's REST paths).
    registry_database_url: str | None = None
    #: Seconds between heartbeats; a gateway missing three is marked dead.
    heartbeat_interval: float = Field(5.0, gt=0)
    #: The bearer token this gateway presents to other clusters' gateways (an account of
    #: theirs); the caller's own account and cluster ride along in the call's metadata.
    peer_token: str | None = None
    #: The accounts of this cluster that other clusters' gateways call it as (those their
    #: ``peer_token``s name; a JSON list of account names). Only a call from one of them may
    #: say who asked on the other cluster (``x-conduit-origin-account``, ``-cluster``,
    #: ``x-conduit-parent-request``, logged as the entry's ``origin`` and ``graph_parent``):
    #: from any other caller those keys are ignored.
    peer_accounts: list[str] = Field(default_factory=list)
    #: Serve ``/metrics`` (Prometheus) on this port (unset: not served) and host.
    metrics_port: int | None = Field(None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    #: Log every ``infer`` call in ``block_inference`` (:mod:`gateway.request_log`): its
    #: packet but the files, its status, error, latency and account; served by the api's
    #: ``/logs/...``. Written off the hot path: a full queue or a failed write drops entries.
    log: bool = False
    #: The database the log goes to (default: this cluster's own; the api reads it from
    #: there, ``CONDUIT_GATEWAY_LOG_DATABASE_URL`` in its environment too).
    log_database_url: str | None = None
    #: Log entries waiting to be written, at most (past it they are dropped), written per
    #: ``COPY`` in batches of ``log_batch``, a batch waiting ``log_flush_interval`` seconds to fill.
    log_queue: int = Field(10_000, ge=1)
    log_batch: int = Field(1000, ge=1)
    log_flush_interval: float = Field(0.25, gt=0)
    #: Days of log kept: older days' partitions are dropped.
    log_retention_days: int = Field(7, ge=1)
    #: A call whose ``data`` is larger is logged without it.
    log_max_data_bytes: int = Field(MIB, ge=0)
