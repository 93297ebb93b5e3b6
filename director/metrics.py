"""Prometheus metrics of a director process, served by its receiver at ``/metrics``.

One :class:`DirectorMetrics` per process, built by its composition root (``director.process``)
and handed to the parts that count: no module holds a registry of its own.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from core.metrics import ProcessMetrics


class DirectorMetrics(ProcessMetrics):
    def __init__(self) -> None:
        super().__init__()
        registry = self.registry
        self.queue_length = Gauge(
            "conduit_queue_length", "Entries in a queue stream.", ["stream"], registry=registry
        )
        self.queue_pending = Gauge(
            "conduit_queue_pending",
            "Entries delivered to a director but not yet acknowledged (the PEL).",
            ["stream"],
            registry=registry,
        )
        self.inflight = Gauge(
            "conduit_director_inflight", "Predictions this director is running.", registry=registry
        )
        self.reclaimed = Counter(
            "conduit_director_reclaimed",
            "Entries taken over from dead directors.",
            registry=registry,
        )
        self.dead_lettered = Counter(
            "conduit_director_dead_lettered",
            "Entries moved to a dead-letter stream.",
            registry=registry,
        )
        self.reenqueued = Counter(
            "conduit_reconciler_reenqueued",
            "Unfinished predictions found in no stream and queued again.",
            registry=registry,
        )
        self.runner_refusals = Counter(
            "conduit_director_runner_refusals",
            "Starts the runner refused (busy, saturated, not_ready, rate_limited); each is "
            "retried.",
            ["reason"],
            registry=registry,
        )
        self.not_started = Counter(
            "conduit_director_not_started",
            "Predictions whose time limit passed while the runner kept refusing them, by last "
            "reason.",
            ["reason"],
            registry=registry,
        )
        self.model_ready = Gauge(
            "conduit_director_model_ready",
            "1 when the deployment's model is loaded on the pool host (its entries are read "
            "first).",
            ["deployment"],
            registry=registry,
        )
        self.oldest_wait = Gauge(
            "conduit_director_oldest_wait_seconds",
            "Seconds the deployment's oldest unread entry has waited (0: none waits), as last "
            "seen.",
            ["deployment"],
            registry=registry,
        )
