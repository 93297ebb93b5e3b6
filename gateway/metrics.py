"""The gateway's own metrics (:class:`core.metrics.ProcessMetrics`): its calls by method and
status, their latency, and what the quota and the request log count (they are handed this
registry). Served on ``CONDUIT_GATEWAY_METRICS_PORT`` when set."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from core.metrics import ProcessMetrics

#: Seconds: from a millisecond (a replay, a refusal) to a long task.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class GatewayMetrics(ProcessMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.calls = Counter(
            "conduit_gateway_calls_total",
            "infer calls answered, by status (the gRPC code's name).",
            ["status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "conduit_gateway_call_seconds",
            "Seconds from an infer call's arrival to its answer.",
            buckets=BUCKETS,
            registry=self.registry,
        )

    def observe(self, status: str, seconds: float) -> None:
        self.calls.labels(status).inc()
        self.latency.observe(seconds)
