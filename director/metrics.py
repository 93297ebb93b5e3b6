"""Prometheus metrics of a director process, served by its receiver at ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry()

QUEUE_LENGTH = Gauge(
    "conduit_queue_length", "Entries in a queue stream.", ["stream"], registry=REGISTRY
)
QUEUE_PENDING = Gauge(
    "conduit_queue_pending",
    "Entries delivered to a director but not yet acknowledged (the PEL).",
    ["stream"],
    registry=REGISTRY,
)
INFLIGHT = Gauge(
    "conduit_director_inflight", "Predictions this director is running.", registry=REGISTRY
)
RECLAIMED = Counter(
    "conduit_director_reclaimed", "Entries taken over from dead directors.", registry=REGISTRY
)
DEAD_LETTERED = Counter(
    "conduit_director_dead_lettered", "Entries moved to a dead-letter stream.", registry=REGISTRY
)
REENQUEUED = Counter(
    "conduit_reconciler_reenqueued",
    "Unfinished predictions found in no stream and queued again.",
    registry=REGISTRY,
)
RUNNER_REFUSALS = Counter(
    "conduit_director_runner_refusals",
    "Starts the runner refused (busy, saturated, not_ready, rate_limited); each is retried.",
    ["reason"],
    registry=REGISTRY,
)
NOT_STARTED = Counter(
    "conduit_director_not_started",
    "Predictions whose time limit passed while the runner kept refusing them, by last reason.",
    ["reason"],
    registry=REGISTRY,
)
MODEL_READY = Gauge(
    "conduit_director_model_ready",
    "1 when the deployment's model is loaded on the pool host (its entries are read first).",
    ["deployment"],
    registry=REGISTRY,
)
OLDEST_WAIT = Gauge(
    "conduit_director_oldest_wait_seconds",
    "Seconds the deployment's oldest unread entry has waited (0: none waits), as last seen.",
    ["deployment"],
    registry=REGISTRY,
)
