"""Director settings, from ``CONDUIT_DIRECTOR_*``, ``DATABASE_URL``, ``REDIS_URL`` and
``CONDUIT_RUNNER_TOKEN`` (the secret it shares with its runner).

What a director serves: one deployment on the runner at ``runner_url``, or several deployments
on the slots of one model pool host (``pool_url``), each ``OWNER/NAME=MODEL`` on the slot
``<pool_url>/models/<MODEL>`` (``=MODEL`` left out: the deployment's own name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


@dataclass(frozen=True, slots=True)
class Route:
    """One deployment a director serves, and the runner it runs it on."""

    deployment: str
    runner_url: str
    #: The pool slot's model, when the runner is a slot of a pool host.
    model: str | None = None


class DirectorSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONDUIT_DIRECTOR_", extra="ignore", env_ignore_empty=True
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
    #: The API's public base URL, for ``urls`` in webhook bodies.
    public_url: str = Field(
        "http://127.0.0.1:8000",
        validation_alias=AliasChoices("CONDUIT_PUBLIC_URL", "CONDUIT_DIRECTOR_PUBLIC_URL"),
    )
    #: Seconds a finished prediction's event stream is kept for SSE replay.
    events_retention: int = 3600
    #: ``OWNER/NAME``, or several ``OWNER/NAME=MODEL`` (comma-separated) on ``pool_url``.
    deployment: str = ""
    #: The runner this director drives, over Cog's HTTP protocol.
    runner_url: str = "http://127.0.0.1:5000"
    #: A model pool host (``conduit runner pool``) whose slots run the deployments: each one's
    #: runner is ``<pool_url>/models/<MODEL>``, and the pool's ``/v1/capabilities`` says which
    #: models are loaded (read first: ``aging_bound``).
    pool_url: str | None = None
    #: Seconds an entry of a deployment whose model is not loaded may wait while entries of
    #: loaded models are read first; past it, it is read regardless (oldest first).
    aging_bound: float = Field(10.0, ge=0)
    #: Sent as ``Authorization: Bearer`` on every call to the runner: the runner's own
    #: ``CONDUIT_RUNNER_TOKEN`` (one name on both sides). A stock Cog server ignores it.
    runner_token: str | None = Field(
        None,
        repr=False,
        validation_alias=AliasChoices("CONDUIT_RUNNER_TOKEN", "CONDUIT_DIRECTOR_RUNNER_TOKEN"),
    )
    #: How api replicas reach the runner, when not by ``runner_url`` (its fleet entry's URL);
    #: with ``pool_url``, how they reach the pool (each slot's fleet URL is under it).
    runner_public_url: str | None = None
    #: Predictions this director runs at once: its runner's slots.
    concurrency: int = Field(1, ge=1)
    #: Stable across restarts of the same sidecar, so a restarted director re-reads its own
    #: unacknowledged entries. Defaults to host name + a hash of deployment and runner URL.
    id: str | None = None
    #: Where the director's receiver listens (its runner's webhooks and uploads, ``/metrics``,
    #: ``/livez``, ``/readyz``); port 0: a free one.
    receiver_host: str = "127.0.0.1"
    receiver_port: int = 0
    #: How runners reach the receiver, when not ``http://receiver_host:receiver_port``.
    receiver_url: str | None = None
    #: With it, stock Cog uploads output files to ``{receiver}/upload/<token>/`` (its
    #: ``--upload-url``) rather than ``{receiver}/upload/``.
    upload_token: str | None = Field(None, repr=False)
    #: Seconds to let in-flight predictions finish after SIGTERM.
    shutdown_grace: float = 30.0
    #: Seconds a runner gets to confirm a cancel before the director records it anyway.
    cancel_grace: float = 5.0
    #: Seconds between re-reads of this director's own unacknowledged entries.
    retry_interval: float = 5.0
    #: Longest block, in milliseconds, of one read of the streams.
    block_ms: int = 1000
    #: Seconds between writes of a running prediction's output and logs to Postgres (and one
    #: at its end).
    flush_interval: float = 0.5
    #: Seconds a run goes before its start (``processing``) is written to Postgres. A run that
    #: ends sooner is written once, at its end (``started_at``: its end less the time the
    #: runner reports), so a ``GET`` shows ``processing`` at most this long after the model
    #: started, with the time it began. 0 writes each start at once, as does a prediction
    #: with ``start``, ``output`` or ``logs`` webhooks (their bodies carry its status). A run
    #: whose director dies before its start is written is followed if its runner still runs
    #: it, else run again (``docs/concepts/failures.md``).
    start_write_delay: float = Field(1.0, ge=0)
    #: Seconds an entry may go without a heartbeat before another director reclaims it.
    visibility_timeout: float = 60.0
    #: Seconds between heartbeats of in-flight entries (default: a quarter of the timeout).
    heartbeat_interval: float | None = None
    #: Seconds between looks for entries to reclaim from dead directors.
    claim_interval: float = 5.0
    #: Deliveries after which an entry is moved to ``dead:{<deployable>}:<shard>``
    #: and its prediction failed.
    max_deliveries: int = Field(3, ge=1)
    #: Seconds between reconciler passes (re-enqueue predictions missing from every stream).
    reconcile_interval: float = 10.0
    #: Only predictions older than this many seconds are considered missing from the queue.
    reconcile_after: float = 10.0
    #: First wait (s) before offering a prediction again to a runner that refused it without
    #: ``Retry-After``; doubles per refusal (with jitter) up to ``start_backoff_max``.
    start_backoff_initial: float = Field(0.05, gt=0)
    start_backoff_max: float = Field(2.0, gt=0)
    #: Longest ``Retry-After`` (s) a refusing runner is obeyed for before asking again (a
    #: per-minute tenant limit asks for up to 60 s; the deadline bounds every wait anyway).
    retry_after_max: float = Field(120.0, gt=0)
    #: Random fraction added on top of a ``Retry-After`` wait, so workers do not retry in step.
    retry_after_jitter: float = Field(0.1, ge=0, le=1)
    #: Seconds between runner health checks while a prediction runs without news.
    runner_check_interval: float = 2.0
    #: Consecutive failed health checks after which a runner counts as gone.
    runner_check_failures: int = 3
    #: Shard count the deployment had before a change: those streams are read until drained.
    drain_shards: int | None = None
    #: Extra stream keys to read until drained (comma-separated), e.g. after a rename.
    drain_streams: str = ""
    #: The version the runner serves (one deployment only); default: the deployment's version
    #: at start. A director started ahead of a release (blue/green) reads only the version's
    #: own streams until the deployment runs that version (``director.release_watch``).
    version: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    #: What this director runs: ``prediction`` (the deployment's queue), or ``training``: the
    #: trainings of the deployment's version, on a Cog trainer (``--x-mode train``) through
    #: its ``/trainings`` endpoint; the trained version goes to each training's destination.
    job_kind: Literal["prediction", "training"] = Field(
        "prediction",
        validation_alias=AliasChoices("CONDUIT_DIRECTOR_JOB_KIND", "DIRECTOR_JOB_KIND"),
    )
    #: Seconds between reads of the served deployments' current versions: a director whose
    #: version is no longer the deployment's stops reading the deployment's streams.
    release_check_interval: float = Field(2.0, gt=0)

    #: Most bytes of output (as JSON) one prediction may produce; past it the run is stopped
    #: and the prediction fails, saying so.
    max_output_bytes: int = Field(64 * 1024 * 1024, ge=1)
    #: Most bytes of logs one prediction may produce; past it, likewise.
    max_log_bytes: int = Field(16 * 1024 * 1024, ge=1)
    #: Most entries kept in one prediction's event stream (trimmed oldest first, about this
    #: many), besides its expiry ``events_retention`` seconds after the end.
    events_max_len: int = Field(100_000, ge=100)

    #: Seconds the main loop may go without a turn before ``/livez`` fails. It turns at least
    #: every ``block_ms``, and every 5 s while Redis is away (its back-off's cap).
    loop_stall_after: float = Field(60.0, gt=0)

    #: Seconds between writes of the runner's fleet entry (``tracker.fleet``).
    fleet_heartbeat_interval: float = Field(2.0, gt=0)
    #: Seconds the entry outlives the last of them (default: three intervals).
    fleet_ttl: float | None = Field(None, gt=0)

    def routes(self) -> list[Route]:
        """The deployments served, each with its runner's URL, in the order given; a
        ``ValueError`` naming the setting when they do not resolve."""
        specs = [part.strip() for part in self.deployment.split(",") if part.strip()]
        if not specs:
            raise ValueError("deployment: name at least one OWNER/NAME")
        routes: list[Route] = []
        for spec in specs:
            name, mapped, model = spec.partition("=")
            name, model = name.strip(), model.strip()
            if name.count("/") != 1 or not all(name.split("/")):
                raise ValueError(f"deployment: {spec!r} is not OWNER/NAME or OWNER/NAME=MODEL")
            if self.pool_url is None:
                if mapped:
                    raise ValueError(f"deployment: {spec!r} names a model: set pool_url too")
                routes.append(Route(name, self.runner_url))
                continue
            model = model or name.split("/")[1]
            url = f"{self.pool_url.rstrip('/')}/models/{model}"
            routes.append(Route(name, url, model))
        names = [route.deployment for route in routes]
        if len(set(names)) < len(names):
            raise ValueError("deployment: a deployment is named twice")
        if len(routes) > 1 and self.pool_url is None:
            raise ValueError("deployment: several deployments run on the slots of a pool_url")
        if len(routes) > 1 and self.version is not None:
            raise ValueError("version: names the version of one deployment, not of several")
        return routes

    def fleet_url(self, route: Route) -> str:
        """How api replicas reach ``route``'s runner (its fleet entry's URL)."""
        if route.model is None or self.pool_url is None:
            return (self.runner_public_url or route.runner_url).rstrip("/")
        return f"{(self.runner_public_url or self.pool_url).rstrip('/')}/models/{route.model}"

    @property
    def fleet_ttl_seconds(self) -> float:
        return self.fleet_ttl or 3 * self.fleet_heartbeat_interval

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat_interval or self.visibility_timeout / 4
