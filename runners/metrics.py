"""The runner's Prometheus metrics, in a registry of its own (one per app, built by
``runners.server.create_app``, so several runners can live in one test process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from core.metrics import ProcessMetrics

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class RunnerMetrics(ProcessMetrics):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.requests = Counter(
            "conduit_runner_requests",
            "Prediction requests by model, tenant and outcome (a terminal status, or why the "
            "request was refused: busy, queue_full, rate_limited, invalid, not_ready).",
            ["model", "tenant", "status"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "conduit_runner_queue_depth", "Predictions waiting for a slot.", registry=r
        )
        self.slots_in_use = Gauge(
            "conduit_runner_slots_in_use", "Prediction slots running a model.", registry=r
        )
        self.inference = Histogram(
            "conduit_runner_inference_seconds",
            "Time the model ran per prediction.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "conduit_runner_queue_wait_seconds",
            "Time a prediction waited for a slot.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cache_lookups = Counter(
            "conduit_runner_cache_lookups",
            "Cache lookups, by cache (result: the runner's result cache; model: the model's own, "
            "such as an LLM's prefix cache) and result (hit or miss).",
            ["cache", "result"],
            registry=r,
        )
        self.cache_hit_ratio = Gauge(
            "conduit_runner_cache_hit_ratio",
            "Cache hits / lookups, the result cache and the model's own caches together.",
            registry=r,
        )
        self.memory = Gauge(
            "conduit_runner_memory_bytes",
            "Memory: process RSS, the loaded model, the result cache, free system memory.",
            ["kind"],
            registry=r,
        )

    def refresh(self, gauges: Callable[[], dict[str, float]]) -> None:
        """Set the point-in-time gauges just before a scrape."""
        values = gauges()
        self.queue_depth.set(values["queue_depth"])
        self.slots_in_use.set(values["slots_in_use"])
        self.cache_hit_ratio.set(values["cache_hit_ratio"])
        for kind in ("rss", "model", "cache", "system_free"):
            self.memory.labels(kind).set(values.get(f"memory_{kind}", 0.0))
